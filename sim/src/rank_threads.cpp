#include "rank_threads.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <climits>
#include <cstdint>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

namespace meshsim::detail {

namespace {

void* thread_main(void* arg) {
  std::unique_ptr<std::function<void()>> fn(static_cast<std::function<void()>*>(arg));
  (*fn)();
  return nullptr;
}

// read_u64 reads the first number of a file (nullopt: no file, "max", or not a number).
std::optional<uint64_t> read_u64(const std::string& path) {
  std::ifstream f(path);
  std::string v;
  if (!(f >> v) || v.empty() || v.size() > 19 || v.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::stoull(v);
}

// status_kib reads a "Key:   123 kB" line of /proc/self/status (or /proc/meminfo).
std::optional<uint64_t> status_kib(const std::string& path, const std::string& key) {
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key + ":", 0) != 0) continue;
    std::istringstream in(line.substr(key.size() + 1));
    uint64_t v = 0;
    if (in >> v) return v;
  }
  return std::nullopt;
}

// cgroup_dir is this process's cgroup v2 directory ("" when there is none).
std::string cgroup_dir() {
  std::ifstream f("/proc/self/cgroup");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("0::", 0) == 0) return "/sys/fs/cgroup" + line.substr(3);
  }
  return "";
}

}  // namespace

RankThread::~RankThread() {
  if (joinable_) pthread_detach(id_);
}

bool RankThread::start(std::function<void()> fn, std::size_t stack_bytes, int* error) {
  pthread_attr_t attr;
  if (int e = pthread_attr_init(&attr); e != 0) {
    *error = e;
    return false;
  }
  int e = pthread_attr_setstacksize(&attr, stack_bytes);
  auto* arg = new std::function<void()>(std::move(fn));
  if (e == 0) e = pthread_create(&id_, &attr, thread_main, arg);
  pthread_attr_destroy(&attr);
  if (e != 0) {
    delete arg;
    *error = e;
    return false;
  }
  joinable_ = true;
  return true;
}

void RankThread::join() {
  if (!joinable_) return;
  pthread_join(id_, nullptr);
  joinable_ = false;
}

void RankThread::detach() {
  if (!joinable_) return;
  pthread_detach(id_);
  joinable_ = false;
}

ThreadLimit rank_thread_limit(std::size_t stack_bytes) {
  ThreadLimit best{INT64_MAX, "", ""};
  auto bind = [&](uint64_t threads, const std::string& bound, const std::string& detail) {
    const auto t = static_cast<int64_t>(std::min<uint64_t>(threads, INT64_MAX));
    if (t < best.threads) best = {t, bound, detail};
  };
  const uint64_t mine = status_kib("/proc/self/status", "Threads").value_or(1);
  // System-wide: threads-max and pid_max bound every task; /proc/loadavg's 4th field counts them.
  uint64_t tasks = 0;
  if (std::ifstream f("/proc/loadavg"); f) {
    std::string a, b, c, rt;
    if (f >> a >> b >> c >> rt) {
      const auto slash = rt.find('/');
      if (slash != std::string::npos) tasks = std::stoull("0" + rt.substr(slash + 1));
    }
  }
  for (const char* path : {"/proc/sys/kernel/threads-max", "/proc/sys/kernel/pid_max"}) {
    if (auto max = read_u64(path)) {
      bind(*max > tasks ? *max - tasks : 0, path, std::to_string(*max) + " tasks, " + std::to_string(tasks) + " in use");
    }
  }
  // Per user (the processes of this user count too; only this one's are known here).
  rlimit nproc{};
  if (getrlimit(RLIMIT_NPROC, &nproc) == 0 && nproc.rlim_cur != RLIM_INFINITY && geteuid() != 0) {
    const auto cur = static_cast<uint64_t>(nproc.rlim_cur);
    bind(cur > mine ? cur - mine : 0, "RLIMIT_NPROC",
         std::to_string(cur) + " tasks for this user, " + std::to_string(mine) + " in this process");
  }
  const std::string cg = cgroup_dir();
  if (!cg.empty()) {
    if (auto max = read_u64(cg + "/pids.max")) {
      const uint64_t cur = read_u64(cg + "/pids.current").value_or(mine);
      bind(*max > cur ? *max - cur : 0, "cgroup pids.max", std::to_string(*max) + " tasks, " + std::to_string(cur) + " in use");
    }
  }
  // Address space: every stack is reserved whole, with a guard page.
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGE_SIZE));
  const uint64_t per_thread = (stack_bytes + page - 1) / page * page + page;
  rlimit as{};
  if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
    const uint64_t used = status_kib("/proc/self/status", "VmSize").value_or(0) * 1024;
    // Room for what else the threads map (malloc arenas of 64 MiB, up to 8 per core).
    const uint64_t arenas = 8ull * static_cast<uint64_t>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN))) * (64ull << 20);
    const auto cur = static_cast<uint64_t>(as.rlim_cur);
    const uint64_t room = cur > used + arenas ? cur - used - arenas : 0;
    bind(room / per_thread, "RLIMIT_AS",
         std::to_string(cur >> 20) + " MiB of address space, " + std::to_string(used >> 20) + " MiB in use, " +
             std::to_string(per_thread >> 10) + " KiB per thread's stack");
  }
  // Memory each thread commits whatever its program does.
  uint64_t avail = status_kib("/proc/meminfo", "MemAvailable").value_or(0) * 1024;
  std::string what = "MemAvailable";
  if (!cg.empty()) {
    if (auto max = read_u64(cg + "/memory.max")) {
      const uint64_t cur = read_u64(cg + "/memory.current").value_or(0);
      const uint64_t room = *max > cur ? *max - cur : 0;
      if (avail == 0 || room < avail) {
        avail = room;
        what = "cgroup memory.max";
      }
    }
  }
  if (avail > 0) {
    bind(avail / kThreadCommit, "memory",
         std::to_string(avail >> 20) + " MiB free (" + what + "), " + std::to_string(kThreadCommit >> 10) +
             " KiB committed per thread");
  }
  return best;
}

}  // namespace meshsim::detail
