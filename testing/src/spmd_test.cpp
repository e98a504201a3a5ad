#include "meshsim/testing/spmd_test.hpp"

#include <gtest/gtest-spi.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "meshsim/error.hpp"
#include "meshsim/fiber_backend.hpp"
#include "meshsim/nccl_api.hpp"

namespace meshsim::testing {

namespace {

// One assertion result captured on a rank thread.
struct Captured {
  int64_t rank;
  ::testing::TestPartResult::Type type;
  std::string file;
  int line;
  std::string message;
};

// Shared with the rank threads; a rank left running after the run (stuck) keeps it alive.
struct Capture {
  std::mutex mu;
  std::vector<Captured> results;

  void take(int64_t rank, const ::testing::TestPartResultArray& array) {
    std::lock_guard lk(mu);
    for (int i = 0; i < array.size(); ++i) {
      const ::testing::TestPartResult& r = array.GetTestPartResult(i);
      results.push_back(Captured{rank, r.type(), r.file_name() ? r.file_name() : "",
                                 r.line_number(), r.message()});
    }
  }
};

class SpmdTest : public ::testing::Test {
 public:
  SpmdTest(int64_t world_size, std::string backend, void (*body)(RankContext&))
      : world_size_(world_size), backend_(std::move(backend)), body_(body) {}
  void TestBody() override { run_on_every_rank(world_size_, backend_, body_); }

 private:
  int64_t world_size_;
  std::string backend_;
  void (*body_)(RankContext&);
};

// skip marks the current test skipped (GTEST_SKIP returns from a void function only).
void skip(const std::string& why) { GTEST_SKIP() << why; }

// report_results turns what the ranks reported into this test's results: each rank's
// failures with its rank, the runner's diagnosis, or a skip when every rank skipped.
RunReport report_results(int64_t world_size, std::string_view backend, RunReport report, Capture& capture) {
  std::vector<Captured> results;
  {
    std::lock_guard lk(capture.mu);
    results = capture.results;
  }
  std::vector<std::string> skipped;
  bool failed = false;
  for (const Captured& c : results) {
    const std::string prefix = "[rank " + std::to_string(c.rank) + "] ";
    if (c.type == ::testing::TestPartResult::kSkip) {
      skipped.push_back(prefix + c.message);
      continue;
    }
    failed = true;
    ADD_FAILURE_AT(c.file.c_str(), c.line) << prefix << c.message;
  }
  if (!report.ok) {
    // An assertion that stopped the run is already reported above with its rank.
    bool only_assertions = true;
    for (const Diagnosis& d : report.failures) only_assertions = only_assertions && d.kind == DiagnosisKind::kAssertion;
    if (!only_assertions || !failed) {
      std::string stuck;
      for (const RankReport& r : report.ranks) {
        if (r.status == RankStatus::kStuck) stuck += " " + std::to_string(r.rank);
      }
      ADD_FAILURE() << "SPMD run over " << world_size << " " << backend << " ranks failed:\n"
                    << report.summary()
                    << (stuck.empty() ? "" : "ranks still running (left detached):" + stuck);
    }
  } else if (!failed && !skipped.empty()) {
    std::string why;
    for (const std::string& s : skipped) why += (why.empty() ? "" : "; ") + s;
    skip(why);
  }
  return report;
}

}  // namespace

std::vector<std::string> spmd_backends() {
  // Every registered backend this build has (NCCL's only in builds with NCCL).
  std::vector<std::string> out;
  for (const std::string& name : backend_names()) {
    if (find_backend(name)->built) out.push_back(name);
  }
  return out;
}

std::chrono::milliseconds default_timeout() {
  const char* env = std::getenv("MESHSIM_TEST_TIMEOUT");
  if (env == nullptr || *env == '\0') return std::chrono::milliseconds(30000);
  char* end = nullptr;
  errno = 0;
  const double s = std::strtod(env, &end);
  if (errno != 0 || end == env || *end != '\0' || !std::isfinite(s) || s <= 0 || s > 86400) {
    throw InvalidArgument("MESHSIM_TEST_TIMEOUT='" + std::string(env) +
                          "' is not a number of seconds in (0, 86400]");
  }
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(s * 1000.0)));
}

RunReport run_on_every_rank(int64_t world_size, std::string_view backend,
                            const std::function<void(RankContext&)>& fn,
                            std::chrono::milliseconds timeout) {
  const BackendEntry* entry = find_backend(backend);
  if (entry && entry->precondition) {
    // What the backend needs for every rank (NCCL: a GPU each); without it the test is skipped,
    // saying why.
    if (auto why = entry->precondition(world_size, 0)) {
      RunReport skipped_report;
      skipped_report.backend = std::string(backend);
      skip("the " + std::string(backend) + " backend cannot run " + std::to_string(world_size) + " ranks here: " + *why);
      return skipped_report;
    }
  }
  auto capture = std::make_shared<Capture>();
  SpmdOptions options;
  options.world_size = world_size;
  options.backend = std::string(backend);
  options.timeout = timeout;
  // The fiber backend runs every rank on one thread, in turn: one reporter catches every result,
  // and the results reported while a rank ran are that rank's (attributed at each switch).
  const bool fibers = backend == "fiber";
  auto all = std::make_shared<::testing::TestPartResultArray>();
  auto attributed = std::make_shared<int>(0);
  std::optional<::testing::ScopedFakeTestPartResultReporter> intercept_all;
  if (fibers) {
    intercept_all.emplace(::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ALL_THREADS, all.get());
    options.backend_options = FiberBackend::Options{.on_switch = [capture, all, attributed](int64_t rank) {
      ::testing::TestPartResultArray mine;
      for (int i = *attributed; i < all->size(); ++i) mine.Append(all->GetTestPartResult(i));
      *attributed = all->size();
      capture->take(rank, mine);
    }};
  }
  if (fibers) {
    RunReport report = run_spmd(options, [capture, fn, all, attributed](RankContext& ctx) {
      fn(ctx);
      // Attribute what this rank reported since it last started running, then look for a fatal
      // failure among its results of this run.
      ::testing::TestPartResultArray mine;
      for (int i = *attributed; i < all->size(); ++i) mine.Append(all->GetTestPartResult(i));
      *attributed = all->size();
      capture->take(ctx.rank(), mine);
      std::string first;
      {
        std::lock_guard lk(capture->mu);
        for (std::size_t i = 0; i < capture->results.size(); ++i) {
          const Captured& c = capture->results[i];
          if (c.rank == ctx.rank() && c.type == ::testing::TestPartResult::kFatalFailure && first.empty()) {
            first = c.file + ":" + std::to_string(c.line) + ": " + c.message;
          }
        }
      }
      if (!first.empty()) ctx.fail("assertion failed at " + first, DiagnosisKind::kAssertion);
    });
    intercept_all.reset();
    return report_results(world_size, backend, report, *capture);
  }
  // The runner keeps its own copy of the function; `fn` itself may go away with the test.
  RunReport report = run_spmd(options, [capture, fn](RankContext& ctx) {
    ::testing::TestPartResultArray results;
    bool fatal = false;
    {
      ::testing::ScopedFakeTestPartResultReporter intercept(
          ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
      try {
        fn(ctx);
      } catch (...) {
        capture->take(ctx.rank(), results);
        throw;
      }
    }
    capture->take(ctx.rank(), results);
    std::string first;
    for (int i = 0; i < results.size(); ++i) {
      const ::testing::TestPartResult& r = results.GetTestPartResult(i);
      if (r.fatally_failed() && first.empty()) {
        fatal = true;
        first = std::string(r.file_name() ? r.file_name() : "?") + ":" +
                std::to_string(r.line_number()) + ": " + r.summary();
      }
    }
    if (fatal) ctx.fail("assertion failed at " + first, DiagnosisKind::kAssertion);
  });

  return report_results(world_size, backend, report, *capture);
}

namespace detail {

int register_spmd_test(const char* suite, const char* name, const char* file, int line,
                       int64_t world_size, void (*body)(RankContext&)) {
  int n = 0;
  for (const std::string& backend : spmd_backends()) {
    const std::string test_name = std::string(name) + "/" + backend;
    ::testing::RegisterTest(suite, test_name.c_str(), nullptr, nullptr, file, line,
                            [world_size, backend, body]() -> ::testing::Test* {
                              return new SpmdTest(world_size, backend, body);
                            });
    ++n;
  }
  return n;
}

}  // namespace detail

}  // namespace meshsim::testing
