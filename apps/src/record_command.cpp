// `meshsim record` (record_command.hpp): the runner started with the program's Python, waited for
// under a deadline, then every rank's ending and dump read and checked across ranks.
#include "meshsim/record_command.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <set>
#include <thread>

#include "meshsim/decimal.hpp"
#include "meshsim/dump_reader.hpp"
#include "meshsim/error.hpp"
#include "meshsim/fr_check.hpp"
#include "meshsim/fr_report.hpp"
#include "meshsim/json_codec.hpp"
#include "meshsim/stop_signals.hpp"
#include "meshsim/text_file.hpp"

namespace meshsim::record_command {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int64_t kMaxWorld = int64_t{1} << 16;
constexpr const char* kDumpPrefix = "trace_rank_";
// What the runner's own start may take beyond its ranks: the interpreter, torch's import and
// --preload's (seconds).
constexpr double kStartAllowance = 600;

// parse_ranks reads "0-3,7" within [0, world).
std::set<int64_t> parse_ranks(const std::string& text, int64_t world) {
  std::set<int64_t> out;
  std::string_view rest = text;
  if (rest.empty()) throw InvalidArgument("--ranks '' names no rank: give ranks as 0-3,7");
  while (true) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    const std::size_t dash = item.find('-');
    const auto lo = read_decimal(item.substr(0, dash));
    const auto hi = dash == std::string_view::npos ? lo : read_decimal(item.substr(dash + 1));
    if (!lo || !hi) throw InvalidArgument("--ranks '" + text.substr(0, 80) + "': '" + std::string(item.substr(0, 40)) + "' is not a rank or a range a-b");
    if (*lo < 0 || *hi >= world || *lo > *hi) {
      throw InvalidArgument("--ranks '" + text.substr(0, 80) + "': '" + std::string(item.substr(0, 40)) + "' is not within ranks 0-" +
                            std::to_string(world - 1) + " (-n " + std::to_string(world) + ")");
    }
    for (int64_t r = *lo; r <= *hi; ++r) out.insert(r);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return out;
}

void check_options(const Options& o) {
  if (o.nprocs < 1 || o.nprocs > kMaxWorld) {
    throw InvalidArgument("record: -n " + std::to_string(o.nprocs) + " is out of range [1, " + std::to_string(kMaxWorld) + "]");
  }
  if (o.jobs && (*o.jobs < 1 || *o.jobs > 4096)) throw InvalidArgument("record: --jobs " + std::to_string(*o.jobs) + " is out of range [1, 4096]");
  if (!std::isfinite(o.timeout_seconds) || o.timeout_seconds <= 0 || o.timeout_seconds > 1e6) {
    throw InvalidArgument("record: --timeout " + std::to_string(o.timeout_seconds) + " is not a number of seconds in (0, 1e6]");
  }
  if (o.nproc_per_node && (*o.nproc_per_node < 1 || *o.nproc_per_node > o.nprocs)) {
    throw InvalidArgument("record: --nproc-per-node " + std::to_string(*o.nproc_per_node) + " is not in [1, -n " + std::to_string(o.nprocs) + "]");
  }
  if (o.format != "text" && o.format != "json") throw InvalidArgument("record: --format '" + o.format + "' is neither text nor json");
  if (o.program.empty()) throw InvalidArgument("record: no program: give it after --, as `meshsim record -n 4 -- python train.py`");
  const std::string base = fs::path(o.program[0]).filename().string();
  if (base.rfind("python", 0) != 0) {
    throw InvalidArgument("record: the program '" + o.program[0].substr(0, 80) +
                          "' is not run by a Python interpreter: give the Python that runs it first (`-- python train.py ARGS`, "
                          "`-- .venv/bin/python -m pkg.train`); the ranks are forked from that interpreter, torchrun is not needed");
  }
  if (o.program.size() < 2) throw InvalidArgument("record: '" + o.program[0] + "' is given no script: `-- python SCRIPT [ARGS...]` or `-- python -m MODULE`");
  for (const auto& m : o.preload) {
    if (m.empty() || m.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.") != std::string::npos) {
      throw InvalidArgument("record: --preload '" + m.substr(0, 80) + "' is not a module name (letters, digits, _ and .)");
    }
  }
}

// prepare_out makes the output directory (refusing one that holds files) and returns it.
std::string prepare_out(const Options& o) {
  std::string dir;
  if (o.out) {
    dir = *o.out;
    if (dir.empty()) throw InvalidArgument("record: --out '' names no directory");
    std::error_code ec;
    if (fs::exists(dir, ec)) {
      if (!fs::is_directory(dir, ec)) throw InvalidArgument("record: --out '" + dir + "' is not a directory");
      if (fs::directory_iterator(dir, ec) != fs::directory_iterator()) {
        throw InvalidArgument("record: --out '" + dir + "' is not empty: record into a new or empty directory (its dumps would mix with what is there)");
      }
    } else if (!fs::create_directories(dir, ec) || ec) {
      throw InvalidArgument("record: --out '" + dir + "' cannot be made: " + ec.message());
    }
  } else {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/meshsim-record-XXXXXX";
    std::vector<char> buf(templ.begin(), templ.end());
    buf.push_back('\0');
    if (!mkdtemp(buf.data())) throw Unavailable("record: cannot make a directory like '" + templ + "'");
    dir = buf.data();
  }
  std::error_code ec;
  fs::create_directories(fs::path(dir) / "ranks", ec);
  if (ec) throw Unavailable("record: cannot make '" + dir + "/ranks': " + ec.message());
  return dir;
}

struct RunnerEnd {
  int status = 0;
  bool timed_out = false;
  int stopped_by = 0;
};

// run_runner starts `python runner.py ARGS -- PROGRAM...` in its own process group and waits for
// it under `limit` seconds; a stop signal is forwarded to the group (SIGKILL 5 s after).
RunnerEnd run_runner(const std::vector<std::string>& argv_s, double limit) {
  std::vector<char*> argv;
  for (const auto& a : argv_s) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const launch::StopSignals stops;  // forwarded to the runner's process group
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) throw Unavailable("record: cannot start '" + argv_s[0] + "'");
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(128 + SIGKILL);
    execvp(argv[0], argv.data());
    static const char msg[] = "meshsim record: cannot execute the program's Python\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(127);
  }
  setpgid(pid, pid);
  RunnerEnd end;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limit));
  std::optional<Clock::time_point> kill_at;
  while (true) {
    int st = 0;
    const pid_t got = waitpid(pid, &st, WNOHANG);
    if (got == pid) {
      end.status = st;
      break;
    }
    const auto now = Clock::now();
    if (const int sig = launch::StopSignals::caught(); !kill_at && (sig || now > deadline)) {
      end.stopped_by = sig;
      end.timed_out = !sig;
      kill(-pid, sig ? sig : SIGTERM);
      kill_at = now + std::chrono::seconds(5);
    } else if (kill_at && now > *kill_at) {
      kill(-pid, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(-pid, SIGKILL);  // a rank the runner left behind
  return end;
}

std::string rank_line(const nlohmann::json& r, const std::string& dir) {
  const int64_t rank = r.value("rank", int64_t{-1});
  const std::string status = r.value("status", std::string("?"));
  std::string why = r.value("error", std::string());
  if (status == "ok" && r.value("init_calls", 0) == 0) why = "never called init_process_group (it ended with status 0)";
  std::string where = r.value("where", std::string());
  std::string line = "rank " + std::to_string(rank) + ": " + why.substr(0, 400);
  if (!where.empty() && status != "timeout") line += " at " + where.substr(0, 200);
  const double secs = r.value("seconds", 0.0);
  char t[32];
  std::snprintf(t, sizeof t, "%.1f", secs);
  line += " (after " + std::string(t) + " s, " + std::to_string(r.value("records", 0)) + " records; its stderr: " + dir + "/" +
          r.value("stderr", std::string()) + ")";
  return line;
}

bool rank_ok(const nlohmann::json& r) { return r.value("status", std::string()) == "ok" && r.value("init_calls", 0) > 0; }

}  // namespace

int run(const Options& o, std::ostream& out, std::ostream& err) {
  check_options(o);
  const std::set<int64_t> ranks = o.ranks ? parse_ranks(*o.ranks, o.nprocs) : std::set<int64_t>{};
  const int64_t recorded = o.ranks ? static_cast<int64_t>(ranks.size()) : o.nprocs;
  const int64_t jobs = o.jobs.value_or(std::max<int64_t>(1, std::thread::hardware_concurrency()));
  const std::string dir = prepare_out(o);
  const std::string runner = dir + "/ranks/runner.py";
  {
    std::ofstream f(runner, std::ios::binary);
    f << runner_source();
    if (!f.good()) throw Unavailable("record: cannot write '" + runner + "'");
  }
  std::vector<std::string> argv{o.program[0], runner, "--world", std::to_string(o.nprocs), "--out", dir, "--jobs", std::to_string(jobs)};
  char t[64];
  std::snprintf(t, sizeof t, "%.17g", o.timeout_seconds);
  argv.insert(argv.end(), {"--timeout", t, "--per-node", std::to_string(o.nproc_per_node.value_or(o.nprocs))});
  if (o.ranks) argv.insert(argv.end(), {"--ranks", *o.ranks});
  for (const auto& m : o.preload) argv.insert(argv.end(), {"--preload", m});
  if (o.fake_tensors) argv.push_back("--fake-tensors");
  argv.push_back("--");
  argv.insert(argv.end(), o.program.begin() + 1, o.program.end());
  const int64_t waves = (recorded + jobs - 1) / jobs;
  const double limit = kStartAllowance + static_cast<double>(waves) * (o.timeout_seconds + 6);
  const auto t0 = Clock::now();
  const RunnerEnd end = run_runner(argv, limit);
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  if (end.stopped_by) {
    err << "meshsim record: stopped by signal " << end.stopped_by << "; what was recorded is in '" << dir << "'\n";
    return 128 + end.stopped_by;
  }
  if (end.timed_out) {
    throw DeadlineExceeded("record: the runner did not end within " + std::to_string(static_cast<int64_t>(limit)) +
                           " s (its start and every rank's --timeout); what was recorded is in '" + dir + "'");
  }
  if (!WIFEXITED(end.status) || WEXITSTATUS(end.status) != 0) {
    const int code = WIFEXITED(end.status) ? WEXITSTATUS(end.status) : -1;
    if (code == 127) throw InvalidArgument("record: '" + o.program[0] + "' cannot be executed (not found, or not a program)");
    if (code == 2 || code == 3) throw InvalidArgument("record: the program could not be started (its Python said why above)");
    throw Unavailable("record: the runner under '" + o.program[0] + "' " +
                      (WIFSIGNALED(end.status) ? "was killed by signal " + std::to_string(WTERMSIG(end.status))
                                               : "exited with status " + std::to_string(code)) +
                      " (its Python said why above)");
  }
  nlohmann::json summary;
  try {
    summary = nlohmann::json::parse(read_text_file(dir + "/record.json", std::size_t{256} << 20, "record.json"));
    if (!summary.is_object() || !summary.contains("ranks") || !summary["ranks"].is_array()) throw InvalidArgument("no ranks");
  } catch (const std::exception& e) {
    throw Internal("record: the runner's '" + dir + "/record.json' cannot be read: " + e.what());
  }
  std::vector<std::string> findings;
  int64_t with_init = 0;
  for (const auto& r : summary.at("ranks")) {
    if (r.value("init_calls", 0) > 0) ++with_init;
    if (!rank_ok(r)) findings.push_back(rank_line(r, dir));
  }
  std::string program;
  for (std::size_t k = 0; k < o.program.size() && k < 8; ++k) program += (k ? " " : "") + o.program[k].substr(0, 80);
  if (o.program.size() > 8) program += " ...";
  std::string backend;
  for (const auto& r : summary.at("ranks")) {
    if (r.contains("backend_asked") && r["backend_asked"].is_string()) {
      backend = r["backend_asked"].get<std::string>();
      break;
    }
  }
  std::optional<trace::DumpSet> set;
  trace::CheckReport check;
  if (with_init > 0) {
    set = trace::read_dump_dir(dir, std::string(kDumpPrefix));
    // The fake backend moves no data: an all-to-all's totals over its group are not its own.
    check = trace::check_dumps(set->dumps, trace::CheckOptions{.all_to_all_totals = false});
    if (o.ranks && recorded < o.nprocs) {
      // Ranks not recorded (--ranks) leave no dump by design: not a problem, said once.
      std::erase_if(check.problems, [&](trace::Problem& p) {
        if (p.kind != trace::ProblemKind::kMissingDump) return false;
        std::erase_if(p.ranks, [&](int64_t r) { return !ranks.count(r); });
        return p.ranks.empty();
      });
      check.ok = check.problems.empty();
      check.notes.insert(check.notes.begin(), std::to_string(o.nprocs - recorded) +
                                                  " ranks were not recorded (--ranks): what they issue is not known, and not checked");
    }
  }
  const bool ok = findings.empty() && with_init > 0 && check.ok;
  if (o.format == "json") {
    nlohmann::json j{{"ok", ok}, {"dir", dir}, {"seconds", took}, {"record", summary}, {"findings", findings}};
    if (set) j["check"] = trace::report_json(check, *set);
    out << json::output_text(j, 2) << "\n";
    return ok ? 0 : 1;
  }
  char secs[32];
  std::snprintf(secs, sizeof secs, "%.1f", took);
  out << "meshsim record: " << recorded << " of " << o.nprocs << " ranks of '" << program << "' on torch "
      << summary.value("torch", std::string("?")) << " (the fake backend answering init_process_group"
      << (backend.empty() ? std::string() : " for '" + backend.substr(0, 40) + "'") << "), " << jobs << " at a time, in " << secs
      << " s" << (o.fake_tensors ? ", under FakeTensorMode" : "") << "; dumps in '" << dir << "'\n";
  for (const auto& f : findings) out << "FAILED " << f << "\n";
  if (with_init == 0) {
    out << "FAILED: no rank called init_process_group: nothing distributed was recorded\n";
    return 1;
  }
  std::string text = trace::report_text(check, *set);
  const std::size_t verdict = text.rfind(check.ok ? "OK\n" : "FAILED: ");
  const std::string verdict_line = text.substr(verdict);
  text.resize(verdict);
  out << text;
  if (ok) {
    out << "OK\n";
  } else if (check.ok) {
    out << "FAILED: " << findings.size() << (findings.size() == 1 ? " rank" : " ranks") << " did not end as the program should\n";
  } else if (findings.empty()) {
    out << verdict_line;
  } else {
    out << verdict_line.substr(0, verdict_line.size() - 1) << "; " << findings.size() << (findings.size() == 1 ? " rank" : " ranks")
        << " did not end as the program should\n";
  }
  return ok ? 0 : 1;
}

}  // namespace meshsim::record_command
