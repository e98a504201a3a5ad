#include "meshsim/launch.hpp"

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
#include <ostream>

#include "meshsim/error.hpp"
#include "meshsim/launch_env.hpp"
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

// The signal that asked the launcher to stop (0: none); set by the handler, read by the loop.
volatile sig_atomic_t stop_signal = 0;
extern "C" void on_stop_signal(int sig) { stop_signal = sig; }

// StopSignals catches SIGINT, SIGTERM and SIGHUP while the ranks run (the loop forwards them to
// every rank) and restores the previous handlers after.
class StopSignals {
 public:
  StopSignals() {
    stop_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    for (std::size_t i = 0; i < 3; ++i) sigaction(kSignals[i], &sa, &old_[i]);
  }
  ~StopSignals() {
    for (std::size_t i = 0; i < 3; ++i) sigaction(kSignals[i], &old_[i], nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  static constexpr int kSignals[3] = {SIGINT, SIGTERM, SIGHUP};
  struct sigaction old_[3];
};

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "was killed by signal " + std::to_string(WTERMSIG(status));
  return "ended with status " + std::to_string(status);
}

}  // namespace

int run(const Options& o, std::ostream& out, std::ostream& err) {
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
  std::string token;
  if (!o.token_file.empty()) {
    std::ifstream in(o.token_file);
    if (!in || !std::getline(in, token) || token.empty()) {
      throw InvalidArgument("launch: --token-file '" + o.token_file + "' cannot be read or its first line is empty");
    }
  }
  // Descriptors, said up front: two pipes per rank, and a connection per rank (plus tools') on
  // the store this launcher serves. The soft limit is raised as far as the hard one allows.
  {
    const int64_t need = 2 * o.nprocs + (o.store.empty() ? 2 * o.nprocs + 64 : 0) + 64;
    rlimit lim{};
    if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY &&
        static_cast<int64_t>(lim.rlim_cur) < need) {
      rlimit up = lim;
      up.rlim_cur = lim.rlim_max;
      if (::setrlimit(RLIMIT_NOFILE, &up) == 0) lim = up;
      if (lim.rlim_cur != RLIM_INFINITY && static_cast<int64_t>(lim.rlim_cur) < need) {
        throw ResourceExhausted("launch: -n " + std::to_string(o.nprocs) + " needs about " + std::to_string(need) +
                                " file descriptors (two pipes per rank" +
                                (o.store.empty() ? std::string(" and its store connection") : std::string()) +
                                "), but this process may open " + std::to_string(lim.rlim_cur) +
                                " (ulimit -n, hard limit " + std::to_string(lim.rlim_max) +
                                "); raise the limit or start fewer ranks per launcher");
      }
    }
  }
  std::unique_ptr<TcpStoreServer> server;
  std::string host;
  uint16_t port = 0;
  if (o.store.empty()) {
    if (world != o.nprocs) throw InvalidArgument("launch: a world larger than -n needs --store to join");
    // Sized for the job: every rank holds a connection (and a rendezvous or a tool may hold one
    // more), so -n up to its limit never meets the store's default cap.
    server = std::make_unique<TcpStoreServer>(TcpStoreOptions{
        .token = token, .max_connections = std::max<std::size_t>(1024, 2 * static_cast<std::size_t>(o.nprocs) + 64)});
    host = "127.0.0.1";
    port = server->port();
  } else {
    std::tie(host, port) = parse_host_port(o.store, "--store");
  }
  const std::string store = host + ":" + std::to_string(port);

  std::vector<Child> children(static_cast<std::size_t>(o.nprocs));
  std::vector<std::string> argv_s(o.program.begin(), o.program.end());
  std::vector<char*> argv = pointers(argv_s);
  const StopSignals signals;  // before the first fork: a signal from here on reaches every rank
  const pid_t launcher = getpid();
  auto stop_all = [&](int sig) {
    for (Child& c : children) {
      if (c.running && c.pid > 0) kill(-c.pid, sig);
    }
  };
  for (int64_t i = 0; i < o.nprocs; ++i) {
    Child& c = children[static_cast<std::size_t>(i)];
    c.rank = o.rank_offset + i;
    std::vector<std::pair<std::string, std::string>> vars{
        {"MESHSIM_RANK", std::to_string(c.rank)}, {"MESHSIM_WORLD_SIZE", std::to_string(world)},
        {"MESHSIM_LOCAL_RANK", std::to_string(i)}, {"MESHSIM_STORE", store},
        {"RANK", std::to_string(c.rank)}, {"WORLD_SIZE", std::to_string(world)},
        {"LOCAL_RANK", std::to_string(i)}, {"MASTER_ADDR", host}, {"MASTER_PORT", std::to_string(port)}};
    if (!token.empty()) vars.emplace_back("MESHSIM_STORE_TOKEN", token);
    std::vector<std::string> env_s = environment(vars);
    std::vector<char*> envp = pointers(env_s);
    int p_out[2], p_err[2];
    if (pipe2(p_out, O_CLOEXEC) != 0 || pipe2(p_err, O_CLOEXEC) != 0) {
      stop_all(SIGKILL);
      throw Unavailable("launch: cannot create pipes for rank " + std::to_string(c.rank));
    }
    const pid_t pid = fork();
    if (pid < 0) {
      stop_all(SIGKILL);
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

  const auto start = Clock::now();
  std::optional<Clock::time_point> kill_at, term_at;
  int code = 0;
  int stopping = 0;
  std::string why;
  for (;;) {
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
    if (const int sig = stop_signal; sig != 0 && !stopping) {
      // Ctrl-C, SIGTERM or SIGHUP to the launcher: the same signal to every rank, SIGKILL after
      // the grace, and the launcher's status says which signal ended the job.
      stopping = sig;
      code = 128 + sig;
      why = "the launcher got signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
      err << "meshsim launch: " << why << "; forwarding it to every rank, SIGKILL in " << o.grace_seconds << " s\n";
      stop_all(sig);
      kill_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.grace_seconds));
    }
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
    bool any_running = false;
    for (Child& c : children) {
      if (!c.running) continue;
      int st = 0;
      const pid_t r = waitpid(c.pid, &st, WNOHANG);
      if (r == c.pid) {
        c.running = false;
        c.status = st;
        const bool failed = !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        if (failed && code != 0) {
          // Every later failure is said too (which rank ended first within one poll is not known).
          err << "meshsim launch: rank " << c.rank << " " << describe(st) << "\n";
        }
        if (failed && code == 0 && !stopping) {
          code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
          why = "rank " + std::to_string(c.rank) + " " + describe(st);
          err << "meshsim launch: " << why << "; stopping the other ranks in " << o.report_seconds
              << " s unless they end first (time to report their own diagnosis)\n";
          term_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.report_seconds));
        }
      } else {
        any_running = true;
      }
    }
    bool pipes_open = false;
    for (const Child& c : children) pipes_open = pipes_open || c.fd[0] >= 0 || c.fd[1] >= 0;
    if (!any_running && !pipes_open) break;
    if (!any_running && pipes_open && !kill_at) {
      // Every rank has exited but a grandchild holds a pipe: give it the grace period.
      kill_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.grace_seconds));
    }
    if (o.timeout_seconds > 0 && code == 0 &&
        Clock::now() - start > std::chrono::duration<double>(o.timeout_seconds)) {
      code = 124;
      why = "the job ran past --timeout " + std::to_string(o.timeout_seconds) + " s";
      err << "meshsim launch: " << why << "; stopping every rank\n";
      stop_all(SIGTERM);
      kill_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.grace_seconds));
    }
    if (term_at && !kill_at && Clock::now() > *term_at) {
      stop_all(SIGTERM);
      kill_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.grace_seconds));
    }
    if (kill_at && Clock::now() > *kill_at) {
      stop_all(SIGKILL);
      for (Child& c : children) {
        for (int w = 0; w < 2; ++w) {
          if (c.fd[w] >= 0 && !c.running) {
            close(c.fd[w]);
            c.fd[w] = -1;
          }
        }
      }
      kill_at = Clock::now() + std::chrono::seconds(1);
    }
  }
  out.flush();
  if (code != 0) err << "meshsim launch: failed: " << why << "\n";
  return code;
}

}  // namespace meshsim::launch
