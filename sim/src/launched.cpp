#include "meshsim/launched.hpp"

#include "meshsim/error.hpp"

namespace meshsim {

namespace {

// fail_with adds a diagnosis to `end` (split per rank it names, as a RunReport lists them).
void fail_with(LaunchedEnd& end, const Diagnosis& d) {
  end.ok = false;
  end.results.clear();
  if (d.ranks.empty()) end.failures.push_back(d);
  for (int64_t r : d.ranks) {
    Diagnosis one = d;
    one.ranks = {r};
    end.failures.push_back(std::move(one));
  }
}

// barrier: every process meets at the end, so none closes its sockets while a peer still reads
// from them; a failure published meanwhile by another process fails this one too (its rank was
// fine, the job was not).
void barrier(const LaunchedJob& job, LaunchedEnd& end) {
  Store& st = *job.store;
  const std::string failure_key = job.prefix + "/failure", done_key = job.prefix + "/all_done";
  auto adopt_failure = [&] {
    try {
      if (auto d = decode_diagnosis(st.get(failure_key, std::chrono::milliseconds(0)))) {
        fail_with(end, *d);
        return true;
      }
    } catch (const std::exception&) {
    }
    return false;
  };
  try {
    if (job.on_done) job.on_done();
    if (st.add(job.prefix + "/done", 1) == job.world_size) st.set(done_key, "1");
    const auto until = std::chrono::steady_clock::now() + 2 * job.timeout + std::chrono::seconds(5);
    for (;;) {
      try {
        st.get(done_key, std::chrono::milliseconds(100));
        break;
      } catch (const DeadlineExceeded&) {
      }
      if (adopt_failure()) return;
      if (std::chrono::steady_clock::now() >= until) {
        fail_with(end, Diagnosis{DiagnosisKind::kStall, {},
                                 "rank " + std::to_string(job.rank) + " finished, but not every rank reached the end within " +
                                     std::to_string(job.timeout.count()) + " ms",
                                 {}, {}});
        return;
      }
    }
    st.add(job.prefix + "/left", 1);  // the process serving the store waits for every rank to leave
  } catch (const Error& e) {
    if (!adopt_failure()) {
      fail_with(end, Diagnosis{DiagnosisKind::kError, {job.rank}, std::string("the store failed at the end: ") + e.what(), {}, {}});
    }
  }
}

}  // namespace

LaunchedEnd finish_launched(const LaunchedJob& job, RunReport& report, const std::optional<std::string>& result) {
  LaunchedEnd end;
  end.ok = report.ok;
  end.failures = report.failures;
  const std::string result_key = job.prefix + "/result/";
  if (end.ok && !result) {
    fail_with(end, Diagnosis{DiagnosisKind::kError, {job.rank}, "rank " + std::to_string(job.rank) + " returned no result", {}, {}});
  }
  if (end.ok) {
    try {
      job.store->set(result_key + std::to_string(job.rank), *result);
    } catch (const Error& e) {
      fail_with(end, Diagnosis{DiagnosisKind::kError, {job.rank},
                               "rank " + std::to_string(job.rank) + " could not publish its result: " + e.what(), {}, {}});
    }
  }
  if (end.ok) barrier(job, end);
  report.backend_keepalive.reset();  // every rank is past its collectives: close connections now
  if (!end.ok) return end;
  if (job.rank != 0) {
    end.results = {*result};
    return end;
  }
  try {
    for (int64_t r = 0; r < job.world_size; ++r) end.results.push_back(job.store->get(result_key + std::to_string(r), job.timeout));
  } catch (const std::exception& e) {
    fail_with(end, Diagnosis{DiagnosisKind::kError, {job.rank},
                             std::string("rank 0 could not read every rank's result: ") + e.what(), {}, {}});
  }
  return end;
}

}  // namespace meshsim
