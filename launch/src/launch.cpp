#include "meshsim/launch.hpp"
#include "meshsim/stop_signals.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <ostream>

#include "meshsim/job_store.hpp"
#include "meshsim/error.hpp"
#include "meshsim/launch_env.hpp"
#include "meshsim/spmd_backend.hpp"
#include "meshsim/store.hpp"

extern char** environ;

namespace meshsim::launch {

namespace {

using Clock = std::chrono::steady_clock;

struct Child {
  int64_t rank = 0;
  pid_t pid = -1;
  int fd[2] = {-1, -1};          // stdout, stderr pipes (read ends)
  std::string pending[2];        // partial lines
  bool running = true;
  int status = 0;
  std::optional<std::chrono::steady_clock::time_point> ended_ok;  // when it exited 0
};

// environment builds the child's environment: the parent's, with the launch variables replaced.
std::vector<std::string> environment(const std::vector<std::pair<std::string, std::string>>& vars) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string kv(*e);
    const std::string key = kv.substr(0, kv.find('='));
    bool replaced = false;
    for (const auto& [k, _] : vars) replaced = replaced || k == key;
    if (!replaced) env.push_back(kv);
  }
  for (const auto& [k, v] : vars) env.push_back(k + "=" + v);
  return env;
}

std::vector<char*> pointers(std::vector<std::string>& v) {
  std::vector<char*> p;
  for (auto& s : v) p.push_back(s.data());
  p.push_back(nullptr);
  return p;
}

void emit(Child& c, int which, const char* data, std::size_t n, std::ostream& out, std::ostream& err,
          bool flush_partial) {
  std::string& buf = c.pending[which];
  buf.append(data, n);
  std::ostream& os = which == 0 ? out : err;
  std::size_t start = 0;
  for (std::size_t nl; (nl = buf.find('\n', start)) != std::string::npos; start = nl + 1) {
    os << "[rank " << c.rank << "] " << std::string_view(buf).substr(start, nl - start) << '\n';
  }
  buf.erase(0, start);
  // A line longer than 64 KiB is written in pieces rather than held.
  if ((flush_partial && !buf.empty()) || buf.size() > (64 << 10)) {
    os << "[rank " << c.rank << "] " << buf << '\n';
    buf.clear();
  }
  os.flush();
}

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "was killed by signal " + std::to_string(WTERMSIG(status));
  return "ended with status " + std::to_string(status);
}

// check_options applies the flags' rules (InvalidArgument naming the flag); returns the world size.
int64_t check_options(const Options& o) {
  if (o.program.empty()) throw InvalidArgument("launch: no program given (meshsim launch -n N -- program args...)");
  if (o.nprocs < 1 || o.nprocs > 4096) {
    throw InvalidArgument("launch: -n " + std::to_string(o.nprocs) + " is out of range [1, 4096]");
  }
  const int64_t world = o.world.value_or(o.nprocs);
  if (world < 1 || o.rank_offset < 0 || o.rank_offset > world || world - o.rank_offset < o.nprocs) {
    throw InvalidArgument("launch: ranks " + std::to_string(o.rank_offset) + ".." +
                          std::to_string(o.rank_offset + o.nprocs - 1) + " do not fit a world of " +
                          std::to_string(world));
  }
  if (!(o.timeout_seconds >= 0) || !std::isfinite(o.timeout_seconds) || o.timeout_seconds > 1e7) {
    throw InvalidArgument("launch: --timeout " + std::to_string(o.timeout_seconds) + " is not a number of seconds >= 0");
  }
  if (!(o.report_seconds >= 0) || !std::isfinite(o.report_seconds) || o.report_seconds > 1e7) {
    throw InvalidArgument("launch: --report-grace " + std::to_string(o.report_seconds) +
                          " is not a number of seconds in [0, 1e7]");
  }
  if (!o.world && o.rank_offset != 0) throw InvalidArgument("launch: --rank-offset needs --world");
  if (o.store.empty() && world != o.nprocs) throw InvalidArgument("launch: a world larger than -n needs --store to join");
  return world;
}

// ensure_descriptors says up front what the job needs: two pipes per rank, and a connection per
// rank (plus tools') on the store this launcher serves. The soft limit is raised as far as the
// hard one allows.
void ensure_descriptors(const Options& o) {
  const int64_t need = 2 * o.nprocs + (o.store.empty() ? 2 * o.nprocs + 64 : 0) + 64;
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY || static_cast<int64_t>(lim.rlim_cur) >= need) {
    return;
  }
  rlimit up = lim;
  up.rlim_cur = lim.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &up) == 0) lim = up;
  if (lim.rlim_cur != RLIM_INFINITY && static_cast<int64_t>(lim.rlim_cur) < need) {
    throw ResourceExhausted("launch: -n " + std::to_string(o.nprocs) + " needs about " + std::to_string(need) +
                            " file descriptors (two pipes per rank" +
                            (o.store.empty() ? std::string(" and its store connection") : std::string()) +
                            "), but this process may open " + std::to_string(lim.rlim_cur) + " (ulimit -n, hard limit " +
                            std::to_string(lim.rlim_max) + "); raise the limit or start fewer ranks per launcher");
  }
}

void signal_all(std::vector<Child>& children, int sig) {
  for (Child& c : children) {
    if (c.running && c.pid > 0) kill(-c.pid, sig);
  }
}

// Where the ranks meet: the store's address and its token.
struct Meeting {
  std::string host;
  uint16_t port = 0;
  std::string token;
  int64_t world = 0;
};

// start_ranks forks every rank of this host with its launcher variables, its stdout and stderr
// on pipes; on a failure the ranks already started are killed.
void start_ranks(std::vector<Child>& children, const Options& o, const Meeting& m) {
  std::vector<std::string> argv_s(o.program.begin(), o.program.end());
  std::vector<char*> argv = pointers(argv_s);
  const std::string store = m.host + ":" + std::to_string(m.port);
  const pid_t launcher = getpid();
  for (int64_t i = 0; i < o.nprocs; ++i) {
    Child& c = children[static_cast<std::size_t>(i)];
    c.rank = o.rank_offset + i;
    std::vector<std::pair<std::string, std::string>> vars{
        {"MESHSIM_RANK", std::to_string(c.rank)}, {"MESHSIM_WORLD_SIZE", std::to_string(m.world)},
        {"MESHSIM_LOCAL_RANK", std::to_string(i)}, {"MESHSIM_STORE", store},
        {"RANK", std::to_string(c.rank)}, {"WORLD_SIZE", std::to_string(m.world)},
        {"LOCAL_RANK", std::to_string(i)}, {"MASTER_ADDR", m.host}, {"MASTER_PORT", std::to_string(m.port)}};
    if (!m.token.empty()) vars.emplace_back("MESHSIM_STORE_TOKEN", m.token);
    std::vector<std::string> env_s = environment(vars);
    std::vector<char*> envp = pointers(env_s);
    int p_out[2], p_err[2];
    if (pipe2(p_out, O_CLOEXEC) != 0 || pipe2(p_err, O_CLOEXEC) != 0) {
      signal_all(children, SIGKILL);
      throw Unavailable("launch: cannot create pipes for rank " + std::to_string(c.rank));
    }
    const pid_t pid = fork();
    if (pid < 0) {
      signal_all(children, SIGKILL);
      throw Unavailable("launch: cannot start rank " + std::to_string(c.rank));
    }
    if (pid == 0) {
      // The child: only async-signal-safe calls until exec. It dies with the launcher, even one
      // killed with SIGKILL (which no handler sees); the caught stop signals reset at exec.
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != launcher) _exit(128 + SIGKILL);  // the launcher died before prctl
      dup2(p_out[1], 1);
      dup2(p_err[1], 2);
      execvpe(argv[0], argv.data(), envp.data());
      static const char msg[] = "meshsim launch: cannot execute the program\n";
      (void)!write(2, msg, sizeof msg - 1);
      _exit(127);
    }
    setpgid(pid, pid);
    close(p_out[1]);
    close(p_err[1]);
    c.pid = pid;
    c.fd[0] = p_out[0];
    c.fd[1] = p_err[0];
  }
}

// forward_output waits up to 50 ms for output of any rank and forwards it, line by line.
void forward_output(std::vector<Child>& children, std::ostream& out, std::ostream& err) {
  std::vector<pollfd> fds;
  std::vector<std::pair<Child*, int>> who;
  for (Child& c : children) {
    for (int w = 0; w < 2; ++w) {
      if (c.fd[w] >= 0) {
        fds.push_back(pollfd{c.fd[w], POLLIN, 0});
        who.emplace_back(&c, w);
      }
    }
  }
  if (!fds.empty()) poll(fds.data(), fds.size(), 50);
  for (std::size_t k = 0; k < fds.size(); ++k) {
    if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    auto [c, w] = who[k];
    char buf[65536];
    const ssize_t n = read(c->fd[w], buf, sizeof buf);
    if (n > 0) {
      emit(*c, w, buf, static_cast<std::size_t>(n), out, err, false);
    } else {
      emit(*c, w, "", 0, out, err, true);
      close(c->fd[w]);
      c->fd[w] = -1;
    }
  }
}

// Supervision is the job's end as it unfolds: the exit code, why, and when to escalate.
struct Supervision {
  int code = 0;
  int stopping = 0;  // the stop signal the launcher got
  std::string why;
  std::optional<Clock::time_point> kill_at, term_at;
  std::optional<Clock::time_point> failed_at;  // when the first rank failed
};

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// reap collects the ranks that ended; the first failure sets the code and gives the others the
// report grace. Returns whether any rank still runs.
bool reap(std::vector<Child>& children, const Options& o, Supervision& s, std::ostream& err) {
  bool any_running = false;
  for (Child& c : children) {
    if (!c.running) continue;
    int st = 0;
    if (waitpid(c.pid, &st, WNOHANG) != c.pid) {
      any_running = true;
      continue;
    }
    c.running = false;
    c.status = st;
    const bool failed = !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    if (!failed) c.ended_ok = Clock::now();
    if (failed && !s.failed_at) s.failed_at = Clock::now();
    if (failed && s.code != 0) {
      // Every later failure is said too (which rank ended first within one poll is not known).
      err << "meshsim launch: rank " << c.rank << " " << describe(st) << "\n";
    }
    if (failed && s.code == 0 && !s.stopping) {
      s.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
      s.why = "rank " + std::to_string(c.rank) + " " + describe(st);
      err << "meshsim launch: " << s.why << "; stopping the other ranks in " << o.report_seconds
          << " s unless they end first (time to report their own diagnosis)\n";
      s.term_at = after(o.report_seconds);
    }
  }
  return any_running;
}

// supervise forwards the ranks' output until every rank ended and its pipes closed: a stop
// signal is forwarded (SIGKILL after the grace), a failed rank stops the others after the report
// grace, --timeout stops the job; returns the exit code.
int supervise(std::vector<Child>& children, const Options& o, std::ostream& out, std::ostream& err) {
  const auto start = Clock::now();
  Supervision s;
  for (;;) {
    forward_output(children, out, err);
    if (const int sig = StopSignals::caught(); sig != 0 && !s.stopping) {
      // Ctrl-C, SIGTERM or SIGHUP to the launcher: the same signal to every rank, SIGKILL after
      // the grace, and the launcher's status says which signal ended the job.
      s.stopping = sig;
      s.code = 128 + sig;
      s.why = "the launcher got signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
      err << "meshsim launch: " << s.why << "; forwarding it to every rank, SIGKILL in " << o.grace_seconds << " s\n";
      signal_all(children, sig);
      s.kill_at = after(o.grace_seconds);
    }
    const bool any_running = reap(children, o, s, err);
    bool pipes_open = false;
    for (const Child& c : children) pipes_open = pipes_open || c.fd[0] >= 0 || c.fd[1] >= 0;
    if (!any_running && !pipes_open) break;
    // Every rank has exited but a grandchild holds a pipe: give it the grace period.
    if (!any_running && pipes_open && !s.kill_at) s.kill_at = after(o.grace_seconds);
    if (o.timeout_seconds > 0 && s.code == 0 && Clock::now() - start > std::chrono::duration<double>(o.timeout_seconds)) {
      s.code = 124;
      s.why = "the job ran past --timeout " + std::to_string(o.timeout_seconds) + " s";
      err << "meshsim launch: " << s.why << "; stopping every rank\n";
      signal_all(children, SIGTERM);
      s.kill_at = after(o.grace_seconds);
    }
    if (s.term_at && !s.kill_at && Clock::now() > *s.term_at) {
      signal_all(children, SIGTERM);
      s.kill_at = after(o.grace_seconds);
    }
    if (s.kill_at && Clock::now() > *s.kill_at) {
      signal_all(children, SIGKILL);
      for (Child& c : children) {
        for (int w = 0; w < 2; ++w) {
          if (c.fd[w] >= 0 && !c.running) {
            close(c.fd[w]);
            c.fd[w] = -1;
          }
        }
      }
      s.kill_at = Clock::now() + std::chrono::seconds(1);
    }
  }
  out.flush();
  if (s.code != 0) {
    err << "meshsim launch: failed: " << s.why << "\n";
    // A rank that ended with status 0 before any rank failed left its peers waiting for it (a
    // rank that never started its program, or left it early): the likely cause, said by name.
    std::vector<int64_t> early;
    for (const Child& c : children) {
      if (c.ended_ok && s.failed_at && *c.ended_ok < *s.failed_at) early.push_back(c.rank);
    }
    if (!early.empty()) {
      const auto at = std::chrono::duration_cast<std::chrono::milliseconds>(
                          *children[static_cast<std::size_t>(early[0])].ended_ok - start).count();
      const std::string who = early.size() == 1 ? "rank " + std::to_string(early[0]) : "ranks " + format_ranks(early);
      err << "meshsim launch: " << who << " exited with status 0 before any rank failed (the first after " << at
          << " ms) while the others still ran: the others waited for " << (early.size() == 1 ? "it" : "them") << "\n";
    }
  }
  return s.code;
}

}  // namespace

int run(const Options& o, std::ostream& out, std::ostream& err) {
  Meeting m;
  m.world = check_options(o);
  if (!o.token_file.empty()) m.token = launch::read_token_file(o.token_file, "launch: --token-file");
  ensure_descriptors(o);
  std::unique_ptr<TcpStoreServer> server;
  if (o.store.empty()) {
    // Sized for the job: every rank holds a connection (and a rendezvous or a tool may hold one
    // more), so -n up to its limit never meets the store's default cap.
    server = std::make_unique<TcpStoreServer>(TcpStoreOptions{
        .token = m.token, .max_connections = std::max<std::size_t>(1024, 2 * static_cast<std::size_t>(o.nprocs) + 64)});
    m.host = "127.0.0.1";
    m.port = server->port();
  } else {
    std::tie(m.host, m.port) = parse_host_port(o.store, "--store");
  }
  std::vector<Child> children(static_cast<std::size_t>(o.nprocs));
  const StopSignals signals;  // before the first fork: a signal from here on reaches every rank
  start_ranks(children, o, m);
  return supervise(children, o, out, err);
}

}  // namespace meshsim::launch
