#include "meshsim/spmd.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <new>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "meshsim/digest.hpp"
#include "meshsim/error.hpp"
#include "rank_threads.hpp"

namespace meshsim {

namespace {

using Clock = std::chrono::steady_clock;



Diagnosis stall_diagnosis(const SpmdBackend& backend, std::chrono::milliseconds timeout,
                          const std::string& extra) {
  return meshsim::stall_diagnosis(backend.waits(), "no progress for " + std::to_string(timeout.count()) + " ms",
                                  extra);
}

// RankExited unwinds a rank thread that exit_abruptly ended (not an std::exception, so user code
// that catches those does not swallow it).
struct RankExited {};

struct Shared {
  std::shared_ptr<SpmdBackend> backend;
  int64_t first = 0;
  bool process_rank = false;
  std::function<void(RankContext&)> fn;
  std::chrono::milliseconds timeout;
  std::mutex mu;
  std::condition_variable cv;
  int64_t done = 0;
  std::atomic<int64_t> started{0};  // ranks whose program began: start-up is progress too
  std::vector<RankReport> reports;
  std::vector<bool> finished;
  std::vector<bool> exited;
};

void run_rank(const std::shared_ptr<Shared>& sh, int64_t r) {
  sh->started.fetch_add(1, std::memory_order_relaxed);
  RankReport rep{r, RankStatus::kOk, ""};
  SpmdBackend& b = *sh->backend;
  bool exited = false;
  try {
    RankContext ctx(sh->backend, r, sh->process_rank);
    sh->fn(ctx);
  } catch (const RankExited&) {
    exited = true;
    rep = {r, RankStatus::kFailed, "rank " + std::to_string(r) + " exited abruptly"};
  } catch (const Aborted& e) {
    rep = {r, RankStatus::kAborted, e.what()};
  } catch (const DeadlineExceeded& e) {
    Diagnosis d = stall_diagnosis(b, sh->timeout, e.what());
    if (d.ranks.empty()) d.ranks = {r};
    b.abort(std::move(d));
    rep = {r, RankStatus::kFailed, e.what()};
  } catch (const Error& e) {
    const std::string msg = "rank " + std::to_string(r) + " failed: " + e.type_name() + ": " + e.what();
    if (!b.abort(Diagnosis{DiagnosisKind::kError, {r}, msg, {}, {}})) rep = {r, RankStatus::kAborted, e.what()};
    else rep = {r, RankStatus::kFailed, msg};
  } catch (const std::bad_alloc&) {
    const std::string msg = "rank " + std::to_string(r) + " failed: ResourceExhausted: out of memory (an allocation failed)";
    b.abort(Diagnosis{DiagnosisKind::kError, {r}, msg, {}, {}});
    rep = {r, RankStatus::kFailed, msg};
  } catch (const std::exception& e) {
    const std::string msg = "rank " + std::to_string(r) + " failed: " + e.what();
    b.abort(Diagnosis{DiagnosisKind::kError, {r}, msg, {}, {}});
    rep = {r, RankStatus::kFailed, msg};
  } catch (...) {
    const std::string msg = "rank " + std::to_string(r) + " failed with an unknown exception";
    b.abort(Diagnosis{DiagnosisKind::kError, {r}, msg, {}, {}});
    rep = {r, RankStatus::kFailed, msg};
  }
  // A rank that exited abruptly does not depart: its peers find out as they would from a crash.
  if (!exited) b.depart(r);
  std::lock_guard lk(sh->mu);
  const auto i = static_cast<std::size_t>(r - sh->first);
  sh->reports[i] = std::move(rep);
  sh->finished[i] = true;
  sh->exited[i] = exited;
  ++sh->done;
  sh->cv.notify_all();
}

}  // namespace

MeshParts mesh_parts(const DeviceMesh& mesh) {
  MeshParts p;
  Fnv1a shape, names, layout, ranks;
  for (int64_t s : mesh.shape()) shape.u64(static_cast<uint64_t>(s));
  if (mesh.names()) {
    for (const auto& n : *mesh.names()) names.str(n);
  } else {
    names.u64(uint64_t{0xFFFF});
  }
  layout.str(to_string(mesh.layout()));
  if (auto start = mesh.rank_map_start()) {
    ranks.u64(uint64_t{1});
    ranks.u64(static_cast<uint64_t>(*start));
    ranks.u64(static_cast<uint64_t>(mesh.rank_map_size()));
  } else {
    ranks.u64(uint64_t{2});
    for (int64_t r : mesh.rank_map()) ranks.u64(static_cast<uint64_t>(r));
  }
  return MeshParts{shape.value(), names.value(), layout.value(), ranks.value()};
}

RankContext::RankContext(std::shared_ptr<SpmdBackend> backend, int64_t rank, bool process_rank)
    : backend_(std::move(backend)), rank_(rank), process_rank_(process_rank), world_(backend_->world(rank)),
      comms_(*backend_, rank) {}

void RankContext::exit_abruptly() {
  if (process_rank_) {
    std::fflush(nullptr);
    std::_Exit(86);
  }
  if (backend_->exit_abruptly(rank_)) throw RankExited{};
  backend_->abort(Diagnosis{DiagnosisKind::kExit, {rank_}, "rank " + std::to_string(rank_) +
                            " exited abruptly (its thread ended without finishing its collectives)", {}, {}});
  throw RankExited{};
}

void RankContext::fail(const std::string& message, DiagnosisKind kind) {
  backend_->abort(Diagnosis{kind, {rank_}, "rank " + std::to_string(rank_) + ": " + message, {}, {}});
  throw Aborted(backend_->diagnosis()->message);
}

void RankContext::sleep_for(std::chrono::milliseconds d) {
  if (!backend_->sleep_for(d)) throw Aborted(backend_->diagnosis()->message);
}

void RankContext::check_mesh_agreement(const DeviceMesh& mesh, std::optional<MeshParts> expected) {
  const MeshParts mine = mesh_parts(mesh);
  const int64_t mine_v[4] = {static_cast<int64_t>(mine.shape), static_cast<int64_t>(mine.names),
                             static_cast<int64_t>(mine.layout), static_cast<int64_t>(mine.rank_map)};
  // First an O(1) check: the minimum and maximum of every part over the world (max as the
  // minimum of the complement), and whether any rank differs from `expected`. Only when they
  // disagree do the ranks gather every fingerprint (O(world) each) to name the odd ones.
  {
    const bool differs = expected && !(mine == *expected);
    int64_t v[9];
    for (int i = 0; i < 4; ++i) {
      v[i] = mine_v[i];
      v[4 + i] = ~mine_v[i];
    }
    v[8] = differs ? 0 : 1;
    world_->all_reduce(std::span<int64_t>(v, 9), ReduceOp::kMin);
    bool agree = v[8] == 1;
    for (int i = 0; i < 4; ++i) agree = agree && v[i] == ~v[4 + i];
    if (agree) return;
  }
  // They disagree. Every step below is a collective of a few values, or of a bitmap of the odd
  // ranks in chunks: memory stays O(1) per rank plus one chunk (no rank gathers every
  // fingerprint, which at 16,384 rank threads was 11.6 GB).
  constexpr int64_t kNone = INT64_MAX;
  auto digest_of = [](const MeshParts& p) {
    Fnv1a h;
    h.u64(p.shape);
    h.u64(p.names);
    h.u64(p.layout);
    h.u64(p.rank_map);
    return static_cast<int64_t>(h.value() & 0x7FFFFFFFFFFFFFFEull);  // below kNone
  };
  const int64_t me = world_->rank();
  const int64_t n = world_->size();
  const int64_t my_digest = digest_of(mine);
  int64_t ref_digest = 0;
  if (expected) {
    ref_digest = digest_of(*expected);
  } else {
    // The majority's mesh (on a tie, the one the lowest rank built): visit the distinct meshes
    // in digest order, two small collectives each, until no unvisited mesh can win.
    int64_t candidate = kNone, best_count = 0, best_lowest = kNone, counted = 0;
    {
      int64_t v = my_digest;
      world_->all_reduce(std::span<int64_t>(&v, 1), ReduceOp::kMin);
      candidate = v;
    }
    for (int round = 0; candidate != kNone && round < 64 && best_count <= n - counted; ++round) {
      const bool holds = my_digest == candidate;
      int64_t count = holds ? 1 : 0;
      world_->all_reduce(std::span<int64_t>(&count, 1), ReduceOp::kSum);
      int64_t next[2] = {my_digest > candidate ? my_digest : kNone, holds ? me : kNone};
      world_->all_reduce(std::span<int64_t>(next, 2), ReduceOp::kMin);
      if (count > best_count || (count == best_count && next[1] < best_lowest)) {
        best_count = count;
        best_lowest = next[1];
        ref_digest = candidate;
      }
      counted += count;
      candidate = next[0];
    }
  }
  // The reference's parts, from the ranks that hold it (or `expected`), and what differs.
  int64_t v[5];
  const bool odd = my_digest != ref_digest;
  const int64_t ref_v[4] = {expected ? static_cast<int64_t>(expected->shape) : 0,
                            expected ? static_cast<int64_t>(expected->names) : 0,
                            expected ? static_cast<int64_t>(expected->layout) : 0,
                            expected ? static_cast<int64_t>(expected->rank_map) : 0};
  for (int i = 0; i < 4; ++i) v[i] = expected ? ref_v[i] : (odd ? kNone : mine_v[i]);
  v[4] = 0;
  world_->all_reduce(std::span<int64_t>(v, 5), ReduceOp::kMin);
  const MeshParts ref{static_cast<uint64_t>(v[0]), static_cast<uint64_t>(v[1]), static_cast<uint64_t>(v[2]),
                      static_cast<uint64_t>(v[3])};
  int64_t flags[5] = {odd && mine.shape != ref.shape, odd && mine.names != ref.names, odd && mine.layout != ref.layout,
                      odd && mine.rank_map != ref.rank_map, odd ? 1 : 0};
  world_->all_reduce(std::span<int64_t>(flags, 5), ReduceOp::kSum);
  const int64_t odd_count = flags[4];
  if (odd_count == 0) return;
  MeshParts differs;  // every part any odd rank differs in
  differs.shape = flags[0] > 0;
  differs.names = flags[1] > 0;
  differs.layout = flags[2] > 0;
  differs.rank_map = flags[3] > 0;
  // The odd ranks: a bitmap over the world's members (each sets only its own bit, so a sum is
  // an or), in chunks of 16,384 members, stopping once every odd rank was found.
  constexpr int64_t kChunkRanks = 16384;
  std::vector<int64_t> odd_ranks;
  std::vector<int64_t> words(static_cast<std::size_t>(kChunkRanks / 64));
  for (int64_t base = 0; base < n && static_cast<int64_t>(odd_ranks.size()) < odd_count; base += kChunkRanks) {
    const int64_t len = std::min(kChunkRanks, n - base);
    const auto nwords = static_cast<std::size_t>((len + 63) / 64);
    std::fill(words.begin(), words.begin() + static_cast<std::ptrdiff_t>(nwords), 0);
    if (odd && me >= base && me < base + len) {
      const int64_t bit = me - base;
      words[static_cast<std::size_t>(bit / 64)] = static_cast<int64_t>(uint64_t{1} << (bit % 64));
    }
    world_->all_reduce(std::span<int64_t>(words.data(), nwords), ReduceOp::kSum);
    for (std::size_t w = 0; w < nwords; ++w) {
      const auto bits = static_cast<uint64_t>(words[w]);
      for (int b = 0; b < 64; ++b) {
        if (bits >> b & 1) odd_ranks.push_back(world_->global_ranks()[static_cast<std::size_t>(base + static_cast<int64_t>(w) * 64 + b)]);
      }
    }
  }
  backend_->abort(mesh_diagnosis(odd_ranks, differing_parts(differs, MeshParts{}), expected.has_value(), mesh.to_string()));
  throw Aborted(backend_->diagnosis()->message);
}

std::vector<std::string> differing_parts(const MeshParts& a, const MeshParts& ref) {
  std::vector<std::string> out;
  if (a.shape != ref.shape) out.push_back("shape");
  if (a.names != ref.names) out.push_back("names");
  if (a.layout != ref.layout) out.push_back("layout");
  if (a.rank_map != ref.rank_map) out.push_back("rank map");
  return out;
}

std::string_view to_string(RankStatus status) {
  constexpr std::string_view kNames[] = {"ok", "failed", "aborted", "stuck"};  // in RankStatus's order
  const auto i = static_cast<std::size_t>(status);
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

std::string RunReport::summary() const {
  if (ok) {
    return std::to_string(ranks.size()) + " ranks ok, " + std::to_string(collectives) +
           " collectives";
  }
  std::string s;
  for (const Diagnosis& d : failures) {
    s += "rank " + (d.ranks.empty() ? std::string("?") : std::to_string(d.ranks[0])) + " [" +
         std::string(to_string(d.kind)) + "]: " + d.message + "\n";
  }
  return s;
}

namespace {

// check_options validates a run's options; returns its backend and how many ranks run here.
std::pair<const BackendEntry*, int64_t> check_options(const SpmdOptions& options) {
  const BackendEntry* entry = find_backend(options.backend);
  if (entry == nullptr) {
    throw InvalidArgument("run_spmd: backend '" + options.backend + "' is not available (known: " +
                          backend_names_text() + ")");
  }
  if (options.world_size < 1 || options.world_size > kMaxSpmdWorld) {
    throw InvalidArgument("run_spmd: world size " + std::to_string(options.world_size) + " is out of range [1, " +
                          std::to_string(kMaxSpmdWorld) + "]");
  }
  check_timeout("run_spmd", options.timeout);
  if (options.stack_bytes != 0 && (options.stack_bytes < kMinStackBytes || options.stack_bytes > kMaxStackBytes)) {
    throw InvalidArgument("run_spmd: a rank's stack of " + std::to_string(options.stack_bytes) +
                          " bytes is out of range [64 KiB, 1 GiB]");
  }
  const int64_t first = options.placement.first_rank;
  const int64_t count = options.placement.ranks_here(options.world_size);
  if (count > entry->max_rank_threads) {
    throw InvalidArgument("run_spmd: " + std::to_string(count) + " ranks in one process are over the " +
                          std::to_string(entry->max_rank_threads) + " the " + options.backend + " backend runs");
  }
  if (first < 0 || count < 1 || first > options.world_size || count > options.world_size - first) {
    throw OutOfRange("run_spmd: ranks [" + std::to_string(first) + ", " + std::to_string(first) + " + " +
                     std::to_string(count) + ") are not within the world of " + std::to_string(options.world_size));
  }
  if (count != options.world_size && !entry->spans_processes) {
    std::string spanning;
    for (const std::string& name : backend_names()) {
      if (find_backend(name)->spans_processes) spanning += (spanning.empty() ? "" : " or ") + name;
    }
    throw InvalidArgument("run_spmd: ranks spread over processes need a backend that spans them (" + spanning +
                          "); the " + options.backend + " backend runs every rank in one process");
  }
  return {entry, count};
}

// check_thread_limit refuses, before any starts, more rank threads than this process may start.
void check_thread_limit(int64_t count, std::size_t stack_bytes) {
  const detail::ThreadLimit limit = detail::rank_thread_limit(stack_bytes);
  if (count <= limit.threads) return;
  throw ResourceExhausted("run_spmd: " + std::to_string(count) + " rank threads are more than this process may start (" +
                          std::to_string(limit.threads) + " by " + limit.bound + ": " + limit.detail +
                          "); run fewer ranks in this process, smaller stacks (stack_bytes " + std::to_string(stack_bytes) +
                          "), or the fiber backend");
}

// start_ranks starts a thread per rank here (or one that runs every rank as a fiber); a rank
// whose thread cannot start ends the run naming it.
std::vector<detail::RankThread> start_ranks(const std::shared_ptr<Shared>& sh, int64_t count, std::size_t stack_bytes) {
  const int64_t first = sh->first;
  std::vector<detail::RankThread> threads;
  threads.reserve(static_cast<std::size_t>(count));
  auto refuse = [&](int64_t r, const std::string& why) {
    sh->backend->abort(Diagnosis{DiagnosisKind::kError, {r}, "could not start the thread of rank " +
                                 std::to_string(r) + ": " + why, {}, {}});
    std::lock_guard lk(sh->mu);
    for (int64_t q = r; q < first + count; ++q) {
      sh->reports[static_cast<std::size_t>(q - first)] = {q, RankStatus::kFailed, why};
      sh->finished[static_cast<std::size_t>(q - first)] = true;
      ++sh->done;
    }
  };
  if (sh->backend->runs_ranks()) {
    // The backend runs every rank (fibers of one thread); the watchdog works as for threads.
    threads.emplace_back();
    int error = 0;
    if (!threads.back().start([sh] { sh->backend->run_ranks([&sh](int64_t r) { run_rank(sh, r); }); },
                              std::max<std::size_t>(stack_bytes, std::size_t{8} << 20), &error)) {
      threads.pop_back();
      refuse(first, std::strerror(error));
    }
    return threads;
  }
  for (int64_t r = first; r < first + count; ++r) {
    threads.emplace_back();
    int error = 0;
    if (!threads.back().start([sh, r] { run_rank(sh, r); }, stack_bytes, &error)) {
      threads.pop_back();
      refuse(r, std::string(std::strerror(error)) + " (" + std::to_string(r - first) + " rank threads had started)");
      break;
    }
  }
  return threads;
}

// watch waits until every rank here returned, or the grace after an abort ran out; with a
// watchdog, a run with no progress for the timeout while a rank has waited that long becomes a
// stall diagnosis. Progress is a rank starting, entering or completing a collective: a world
// that is slow but moving (16,384 threads starting on 2 cores) is not a stall.
void watch(const std::shared_ptr<Shared>& sh, const SpmdOptions& options, int64_t count, bool watchdog,
           std::chrono::milliseconds period) {
  std::optional<Clock::time_point> aborted_at, first_abort;
  int64_t done_at_abort = 0;
  auto quiet_since = Clock::now();
  int64_t seen_done = sh->backend->progress(), seen_started = sh->started.load();
  std::unique_lock lk(sh->mu);
  while (sh->done < count) {
    sh->cv.wait_for(lk, period);
    if (sh->done == count) break;
    lk.unlock();
    if (!sh->backend->aborted() && options.interrupted && options.interrupted()) {
      sh->backend->abort(Diagnosis{DiagnosisKind::kError, {},
                                   "interrupted: the run was stopped from outside before it ended", {}, {}});
    }
    if (sh->backend->aborted()) {
      // The grace runs from the last rank that returned: thousands of rank threads on a few
      // cores unwind for longer than the grace, but each returns in turn; a rank that does not
      // return within the grace of the one before it is stuck. A cap bounds the whole unwind.
      const auto now = Clock::now();
      lk.lock();
      const int64_t done_now = sh->done;
      lk.unlock();
      if (!aborted_at) {
        aborted_at = first_abort = now;
        done_at_abort = done_now;
      } else if (done_now != done_at_abort) {
        aborted_at = now;
        done_at_abort = done_now;
      }
      if (now - *aborted_at > options.grace || now - *first_abort > std::max(options.grace, options.timeout)) {
        lk.lock();
        break;
      }
    } else if (watchdog) {
      const int64_t done_now = sh->backend->progress(), started_now = sh->started.load();
      if (done_now != seen_done || started_now != seen_started) {
        seen_done = done_now;
        seen_started = started_now;
        quiet_since = Clock::now();
      }
      const double oldest = sh->backend->oldest_wait();
      if (oldest * 1000.0 > static_cast<double>(options.timeout.count()) && Clock::now() - quiet_since > options.timeout) {
        sh->backend->abort(stall_diagnosis(*sh->backend, options.timeout, ""));
      }
    }
    lk.lock();
  }
}

// join_ranks joins the ranks that returned and leaves the others detached (reported stuck);
// returns the ranks that exited abruptly.
std::vector<int64_t> join_ranks(const std::shared_ptr<Shared>& sh, std::vector<detail::RankThread>& threads,
                                const SpmdOptions& options, RunReport& report) {
  const bool fibers = sh->backend->runs_ranks();
  const int64_t first = sh->first;
  std::vector<int64_t> exited;
  std::lock_guard lk(sh->mu);
  const std::size_t n = sh->reports.size();
  bool all_finished = true;
  for (std::size_t i = 0; i < n; ++i) all_finished = all_finished && sh->finished[i];
  if (fibers && !threads.empty()) {
    if (all_finished) threads[0].join();
    else threads[0].detach();
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (!fibers && i < threads.size()) {
      if (sh->finished[i]) threads[i].join();
      else threads[i].detach();
    }
    if (!sh->finished[i]) {
      sh->reports[i] = {first + static_cast<int64_t>(i), RankStatus::kStuck,
                        "still running " + std::to_string(options.grace.count()) +
                            " ms after the run was aborted (left detached)"};
    }
    if (sh->exited[i]) exited.push_back(first + static_cast<int64_t>(i));
  }
  report.ranks = sh->reports;
  return exited;
}

// record_diagnosis puts the run's diagnosis (or, when no peer noticed, the ranks that exited)
// into the report, one failure per rank it names.
void record_diagnosis(const Shared& sh, const std::vector<int64_t>& exited, int64_t count, RunReport& report) {
  std::optional<Diagnosis> d = sh.backend->diagnosis();
  if (!d && !exited.empty()) {
    // No peer noticed (the rank exited after its last collective): the runner names it.
    d = Diagnosis{DiagnosisKind::kExit, exited, "rank " + std::to_string(exited[0]) + " exited abruptly", {}, {}};
  }
  if (!d) return;
  report.ok = false;
  if (d->ranks.empty()) report.failures.push_back(*d);  // no rank at fault (a lost store)
  // The waiting and missing lists are O(world) each: the first kDetailedFailures failures carry
  // them, the rest (a stall of thousands of ranks) only the rank and the message.
  std::size_t detailed = 0;
  for (int64_t r : d->ranks) {
    Diagnosis one{d->kind, {r}, d->message, {}, {}};
    if (detailed++ < RunReport::kDetailedFailures) {
      one.waiting = d->waiting;
      one.missing = d->missing;
    }
    report.failures.push_back(std::move(one));
    if (r >= sh.first && r < sh.first + count) {
      auto& rr = report.ranks[static_cast<std::size_t>(r - sh.first)];
      if (rr.status != RankStatus::kStuck) rr = {r, RankStatus::kFailed, d->message};
    }
  }
}

}  // namespace

RunReport run_spmd(const SpmdOptions& options, std::function<void(RankContext&)> fn) {
  const auto [entry, count] = check_options(options);
  const bool everyone_here = count == options.world_size;
  const auto start = Clock::now();
  const auto period = std::clamp(options.timeout / 8, std::chrono::milliseconds(5), std::chrono::milliseconds(250));
  // With every rank here a watchdog sees them all, so the collectives' own deadlines come later
  // and the watchdog writes the diagnosis. Across processes only the deadlines can.
  const bool watchdog = options.watchdog && everyone_here;
  // The collectives' own deadlines stay a backstop behind the watchdog, long enough that a
  // rank waiting while the world is still starting or moving is not cut off by its own.
  const auto op_timeout = watchdog ? options.timeout * 8 + period * 4 + std::chrono::milliseconds(500) : options.timeout;
  auto sh = std::make_shared<Shared>();
  sh->first = options.placement.first_rank;
  sh->process_rank = !everyone_here && count == 1;
  BackendRequest request;
  request.world_size = options.world_size;
  request.placement = options.placement;
  request.placement.local_ranks = count;
  request.timeout = op_timeout;
  request.options = options.backend_options;
  request.stack_bytes = options.stack_bytes;
  sh->backend = entry->create(request);
  const std::size_t stack_bytes = options.stack_bytes != 0       ? options.stack_bytes
                                  : entry->rank_stack_bytes != 0 ? entry->rank_stack_bytes
                                                                 : kDefaultStackBytes;
  if (!sh->backend->runs_ranks()) check_thread_limit(count, stack_bytes);
  sh->fn = std::move(fn);
  sh->timeout = options.timeout;
  const auto n = static_cast<std::size_t>(count);
  sh->reports.resize(n);
  sh->finished.assign(n, false);
  sh->exited.assign(n, false);

  std::vector<detail::RankThread> threads = start_ranks(sh, count, stack_bytes);
  watch(sh, options, count, watchdog, period);
  RunReport report;
  report.backend = options.backend;
  const std::vector<int64_t> exited = join_ranks(sh, threads, options, report);
  for (std::size_t r = threads.size(); r-- > 0;) {
    if (threads[r].joinable()) threads[r].join();
  }
  record_diagnosis(*sh, exited, count, report);
  for (const RankReport& r : report.ranks) report.ok = report.ok && r.status == RankStatus::kOk;
  report.collectives = sh->backend->collectives();
  report.progress = sh->backend->progress();
  report.steps = sh->backend->steps();
  report.connect_seconds = sh->backend->connect_seconds();
  // The backend (its Gloo contexts) goes now, inside the timing, unless a stuck thread uses it.
  bool all_joined = true;
  for (const RankReport& r : report.ranks) all_joined = all_joined && r.status != RankStatus::kStuck;
  if (!everyone_here) report.backend_keepalive = sh->backend;
  if (all_joined) sh->backend.reset();
  report.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return report;
}

}  // namespace meshsim
