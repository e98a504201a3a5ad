// Pipeline schedules as data (meshsim/schedule.hpp): the action grammar, the built-in schedules
// against an enumeration written here from PyTorch's rules (torch/distributed/pipelining/
// schedules.py), lowering, the CSV form, and the progress check that finds the deadlocks PyTorch's
// own simulator misses (pytorch/pytorch#172668: "both ranks are waiting for the send to finish").
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <map>

#include <string>
#include <vector>

#include "meshsim/error.hpp"
#include "meshsim/schedule.hpp"

namespace meshsim::step {
namespace {

std::vector<std::string> row(const Schedule& s, int64_t r) {
  std::vector<std::string> out;
  for (const auto& a : s.ranks[static_cast<std::size_t>(r)]) out.push_back(a ? to_string(*a) : "");
  return out;
}

TEST(ScheduleActions, ReadAndWrittenInPyTorchsForm) {
  EXPECT_EQ(parse_action("2F0"), (Action{2, ActionType::kF, 0}));
  EXPECT_EQ(parse_action(" 3SEND_F12 "), (Action{3, ActionType::kSendF, 12}));
  EXPECT_EQ(parse_action("1UNSHARD"), (Action{1, ActionType::kUnshard, std::nullopt}));
  EXPECT_EQ(parse_action("0REDUCE_GRAD"), (Action{0, ActionType::kReduceGrad, std::nullopt}));
  for (const char* t : {"0F1", "5B3", "2I0", "2W0", "1SEND_B4", "7RECV_F0", "3RECV_B2", "4RESHARD"}) {
    EXPECT_EQ(to_string(parse_action(t)), t);
  }
  for (const char* bad : {"", "F0", "0X1", "0F", "0UNSHARD3", "0F1x", "0SEND_X1", "-1F0"}) {
    EXPECT_THROW(parse_action(bad), InvalidArgument) << bad;
  }
  EXPECT_THROW(parse_action("99999999999999999999F0"), OutOfRange);
  EXPECT_THROW(parse_action("0F99999999999999999999"), OutOfRange);
}

// A schedule at the action bound holds 2^24 slots: the compact form keeps it near 335 MB (the
// 40-byte slot made GPipe at pp 65536 x 64 microbatches peak at 1.33 GB). The bounds still read
// back whole in 32 bits, and one past them is refused rather than wrapped.
TEST(ScheduleActions, StoredCompactWithTheBoundsKeptExact) {
  EXPECT_LE(sizeof(std::optional<Action>), 20U);
  const std::string top = std::to_string(kMaxStages - 1) + "SEND_B" + std::to_string(kMaxMicrobatches - 1);
  const Action a = parse_action(top);
  EXPECT_EQ(a.stage, kMaxStages - 1);
  EXPECT_EQ(a.microbatch, kMaxMicrobatches - 1);
  EXPECT_EQ(to_string(a), top);
  EXPECT_THROW(parse_action(std::to_string(kMaxStages) + "F0"), OutOfRange);
  EXPECT_THROW(parse_action("0F" + std::to_string(kMaxMicrobatches)), OutOfRange);
  EXPECT_THROW(parse_action("4294967296F0"), OutOfRange);  // 2^32: would wrap to stage 0
}

// GPipe: every forward, then every backward, on every rank.
TEST(BuiltinSchedules, GPipeIsEveryForwardThenEveryBackward) {
  const Schedule s = gpipe(3, 2);
  EXPECT_EQ(row(s, 0), (std::vector<std::string>{"0F0", "0F1", "0B0", "0B1"}));
  EXPECT_EQ(row(s, 2), (std::vector<std::string>{"2F0", "2F1", "2B0", "2B1"}));
  EXPECT_NO_THROW(validate(s));
}

// 1F1B written the classic way (Megatron's and the 1F1B paper's): pp - rank - 1 warm-up
// forwards, then a forward and a backward in turn, then the remaining backwards. PyTorch's
// Schedule1F1B writes it as min(M, pp - rank) forwards then backward-forward pairs: the same order.
std::vector<std::string> classic_1f1b(int64_t pp, int64_t m, int64_t r) {
  std::vector<std::string> out;
  const int64_t warmup = std::min(m, pp - r - 1);
  int64_t f = 0, b = 0;
  for (; f < warmup; ++f) out.push_back(std::to_string(r) + "F" + std::to_string(f));
  for (; f < m; ++f, ++b) {
    out.push_back(std::to_string(r) + "F" + std::to_string(f));
    out.push_back(std::to_string(r) + "B" + std::to_string(b));
  }
  for (; b < m; ++b) out.push_back(std::to_string(r) + "B" + std::to_string(b));
  return out;
}

TEST(BuiltinSchedules, OneFOneBMatchesTheClassicOrder) {
  for (int64_t pp : {1, 2, 4, 8}) {
    for (int64_t m : {1, 2, 3, 4, 8, 16}) {
      const Schedule s = one_f_one_b(pp, m);
      EXPECT_NO_THROW(validate(s)) << pp << " " << m;
      for (int64_t r = 0; r < pp; ++r) EXPECT_EQ(row(s, r), classic_1f1b(pp, m, r)) << "pp=" << pp << " m=" << m << " rank " << r;
    }
  }
  EXPECT_THROW(one_f_one_b(0, 4), InvalidArgument);
  EXPECT_THROW(gpipe(2, 0), InvalidArgument);
  EXPECT_THROW(one_f_one_b(1 << 16, 1 << 20), ResourceExhausted);
}

// Schedule1F1B as PyTorch's _step_microbatches runs it, pp=2 and two microbatches, by hand from
// its loop: rank 0 fires its first forward's send, holds the last warmup send and posts it with
// the first backward's receive in one batch; rank 1 posts its first backward's send with the
// next forward's receive. Held to PyTorch's own class in torch:schedules. In that order, with
// each send and receive alone, rank 0 waits in 0SEND_F1 and rank 1 in 1SEND_B0: only the batches
// let the pipeline on under rendezvous sends.
TEST(BuiltinSchedules, OneFOneBPostsItsSendsAndReceivesAsPyTorchsLoop) {
  const Schedule s = one_f_one_b_lowered(2, 2);
  EXPECT_EQ(row(s, 0), (std::vector<std::string>{"0F0", "0SEND_F0", "0F1", "0SEND_F1", "0RECV_B0", "0B0", "0RECV_B1", "0B1"}));
  EXPECT_EQ(row(s, 1), (std::vector<std::string>{"1RECV_F0", "1F0", "1B0", "1SEND_B0", "1RECV_F1", "1F1", "1B1", "1SEND_B1"}));
  EXPECT_EQ(s.batches[0], (std::vector<int32_t>{-1, -1, -1, 0, 0, -1, -1, -1}));
  EXPECT_EQ(s.batches[1], (std::vector<int32_t>{-1, -1, -1, 0, 0, -1, -1, -1}));
  for (const SendSemantics sem : {SendSemantics::kRendezvous, SendSemantics::kEager}) {
    EXPECT_TRUE(check_progress(s, sem).ok) << check_progress(s, sem).diagnosis;
  }
  Schedule alone = s;
  alone.batches.clear();
  const Progress p = check_progress(alone, SendSemantics::kRendezvous);
  EXPECT_FALSE(p.ok);
  EXPECT_EQ(p.ranks, (std::vector<int64_t>{0, 1}));
  EXPECT_NE(p.diagnosis.find("0SEND_F1"), std::string::npos) << p.diagnosis;
  EXPECT_TRUE(check_progress(alone, SendSemantics::kEager).ok);
  // Its compute order is one_f_one_b's, every size; every rank's pipeline progresses.
  for (int64_t pp : {1, 2, 3, 4, 8}) {
    for (int64_t m : {1, 2, 3, 4, 8, 16}) {
      const Schedule x = one_f_one_b_lowered(pp, m), c = one_f_one_b(pp, m);
      for (int64_t r = 0; r < pp; ++r) {
        std::vector<std::string> compute;
        for (const std::string& a : row(x, r)) {
          if (a.find("SEND") == std::string::npos && a.find("RECV") == std::string::npos) compute.push_back(a);
        }
        EXPECT_EQ(compute, row(c, r)) << pp << " " << m << " rank " << r;
      }
      EXPECT_TRUE(check_progress(x, SendSemantics::kRendezvous).ok) << pp << " " << m;
    }
  }
  // A batch that lacks its peer's half stops both ranks, each named.
  Schedule broken = s;
  broken.ranks[1].erase(broken.ranks[1].begin() + 4);  // rank 1's 1RECV_F1: rank 0's 0SEND_F1 is never met
  broken.batches[1].erase(broken.batches[1].begin() + 4);
  const Progress q = check_progress(broken, SendSemantics::kRendezvous);
  EXPECT_FALSE(q.ok);
  EXPECT_FALSE(q.diagnosis.empty());
}

// Interleaved 1F1B, pp=2 with two stages per rank and two microbatches, worked by hand from
// ScheduleInterleaved1F1B's rules (pytorch/pytorch 00722e648b, schedules.py): one round of 2;
// rank 0 warms up with 4 forwards (stages 0 and 2), idles 2 steps, then cools down with an idle
// and a backward in turn (stage 2 first); rank 1 idles 1 step, warms up with 2 forwards, idles 1,
// runs 1F1B on stage 3, then cools down on stage 1.
TEST(BuiltinSchedules, Interleaved1F1BByPyTorchsRules) {
  const Schedule s = interleaved_1f1b(2, 4, 2);
  EXPECT_EQ(row(s, 0), (std::vector<std::string>{"0F0", "0F1", "2F0", "2F1", "", "", "", "2B0", "", "2B1", "", "0B0", "", "0B1"}));
  EXPECT_EQ(row(s, 1), (std::vector<std::string>{"", "1F0", "1F1", "", "3F0", "3B0", "3F1", "3B1", "", "1B0", "", "1B1"}));
  for (int64_t pp : {2, 4}) {
    for (int64_t local : {1, 2, 3}) {
      for (int64_t m : {pp, 2 * pp, 3 * pp}) {
        const Schedule x = interleaved_1f1b(pp, pp * local, m);
        EXPECT_NO_THROW(validate(x)) << pp << " " << local << " " << m;
        const Schedule low = lower(x);
        EXPECT_TRUE(check_progress(low, SendSemantics::kEager).ok) << pp << " " << local << " " << m;
      }
    }
  }
  // PyTorch's refusal: 10 microbatches over pp=4 are 2 rounds of 5; 9 are not a multiple of 2.
  EXPECT_NO_THROW(interleaved_1f1b(4, 8, 10));
  try {
    interleaved_1f1b(4, 8, 9);
    FAIL() << "9 microbatches over 2 rounds were accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of the number of rounds (2), but got 9"), std::string::npos) << e.what();
  }
  EXPECT_THROW(interleaved_1f1b(4, 6, 4), InvalidArgument);  // 6 stages over 4 ranks
}

TEST(Lowering, EverySendHasItsReceiveOnThePeerAndTheScheduleProgresses) {
  for (auto make : {&gpipe, &one_f_one_b}) {
    for (int64_t pp : {2, 4}) {
      for (int64_t m : {1, 4, 8}) {
        const Schedule low = lower(make(pp, m));
        int64_t sends = 0, recvs = 0;
        for (const auto& r : low.ranks) {
          for (const auto& a : r) {
            sends += a && (a->type == ActionType::kSendF || a->type == ActionType::kSendB);
            recvs += a && (a->type == ActionType::kRecvF || a->type == ActionType::kRecvB);
          }
        }
        EXPECT_EQ(sends, 2 * (pp - 1) * m);  // a forward and a backward per microbatch per boundary
        EXPECT_EQ(recvs, sends);
        EXPECT_TRUE(check_progress(low, SendSemantics::kEager).ok);
        const Progress p = check_progress(low, SendSemantics::kRendezvous);
        EXPECT_TRUE(p.ok) << pp << " " << m << ": " << p.diagnosis;
      }
    }
  }
  // What lowering places, by hand for GPipe over two ranks and one microbatch.
  const Schedule low = lower(gpipe(2, 1));
  EXPECT_EQ(row(low, 0), (std::vector<std::string>{"0F0", "0SEND_F0", "0RECV_B0", "0B0"}));
  EXPECT_EQ(row(low, 1), (std::vector<std::string>{"1RECV_F0", "1F0", "1B0", "1SEND_B0"}));
  EXPECT_THROW(lower(low), InvalidArgument);  // lowered already
}

// pytorch/pytorch#172668, in PyTorch's compute_comms form: rank 0 sends its second forward
// before receiving the first backward, rank 1 sends the first backward before receiving the
// second forward. With eager sends (PyTorch's simulator) it runs; with sends that wait for their
// receive (NCCL's large messages), both ranks wait in their sends.
TEST(Lowering, TheRuntimeLoweringIsWhatPyTorchsMultiStageRuntimeRuns) {
  // Interleaved1F1B, pp 2, 4 stages, 2 microbatches: the pipeline_order_with_comms that torch
  // 2.13's ScheduleInterleaved1F1B builds (printed from the real class): UNSHARD of the next 3
  // stages, idle steps dropped before the sends and receives are placed (rank 0 receives 2RECV_F0
  // before 0F1, not after 0SEND_F1 as _add_send_recv over rank 1's idle steps has it), REDUCE_GRAD
  // after a stage's last backward, RESHARD once its compute is done.
  const Schedule compute = interleaved_1f1b(2, 4, 2);
  const Schedule rt = lower(compute, Lowering::kRuntime);
  EXPECT_EQ(row(rt, 0), (std::vector<std::string>{"0UNSHARD", "2UNSHARD", "0F0", "0SEND_F0", "2RECV_F0", "0F1", "0SEND_F1",
                                                  "2RECV_F1", "2F0", "2SEND_F0", "2F1", "2SEND_F1", "2RECV_B0", "2B0",
                                                  "2SEND_B0", "2RECV_B1", "2B1", "2SEND_B1", "2REDUCE_GRAD", "2RESHARD",
                                                  "0RECV_B0", "0B0", "0RECV_B1", "0B1", "0REDUCE_GRAD", "0RESHARD"}));
  EXPECT_EQ(row(rt, 1), (std::vector<std::string>{"1UNSHARD", "3UNSHARD", "1RECV_F0", "1F0", "1SEND_F0", "1RECV_F1", "1F1",
                                                  "1SEND_F1", "3RECV_F0", "3F0", "3RECV_F1", "3B0", "3SEND_B0", "1RECV_B0",
                                                  "3F1", "3B1", "3SEND_B1", "1RECV_B1", "3REDUCE_GRAD", "3RESHARD", "1B0",
                                                  "1SEND_B0", "1B1", "1SEND_B1", "1REDUCE_GRAD", "1RESHARD"}));
  const Schedule plain = lower(compute);
  const auto r0 = row(plain, 0);
  const auto at = [&](const char* a) { return std::find(r0.begin(), r0.end(), a) - r0.begin(); };
  EXPECT_GT(at("2RECV_F0"), at("0SEND_F1"));  // the other form, kept under --lowering add_send_recv
  EXPECT_TRUE(check_progress(rt, SendSemantics::kRendezvous).ok);
  EXPECT_EQ(parse_lowering("runtime"), Lowering::kRuntime);
  EXPECT_EQ(parse_lowering("add_send_recv"), Lowering::kAddSendRecv);
  EXPECT_THROW(parse_lowering("Runtime"), InvalidArgument);
  // PyTorch's runtime places UNSHARD / RESHARD / REDUCE_GRAD itself and refuses a compute-only
  // schedule that holds them (in its words); the add_send_recv form keeps them where they are.
  Schedule with_unshard = compute;
  with_unshard.ranks[0].insert(with_unshard.ranks[0].begin(), Action{0, ActionType::kUnshard, std::nullopt});
  try {
    lower(with_unshard, Lowering::kRuntime);
    ADD_FAILURE() << "a compute-only schedule with an UNSHARD was lowered as the runtime's";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("Expected compute-only schedule but found communication action '0UNSHARD' at rank 0, position 0"),
              std::string::npos) << e.what();
  }
  EXPECT_EQ(row(lower(with_unshard), 0).front(), "0UNSHARD");
}

TEST(Lowering, FourStagesPerRankEvictTheStageUsedLeastSoon) {
  // With 4 stages on a rank only 3 are unsharded at a time: every UNSHARD after the first of a
  // stage follows its RESHARD, the rank never holds more than 3, and each ends resharded.
  const Schedule rt = lower(interleaved_1f1b(2, 8, 4), Lowering::kRuntime);
  for (std::size_t r = 0; r < rt.ranks.size(); ++r) {
    std::map<int64_t, int> held;
    int active = 0, evictions = 0;
    for (const auto& a : rt.ranks[r]) {
      ASSERT_TRUE(a.has_value());  // idle steps dropped
      if (a->type == ActionType::kUnshard) {
        EXPECT_EQ(held[a->stage]++, 0) << to_string(*a);
        EXPECT_LE(++active, 3);
      } else if (a->type == ActionType::kReshard) {
        EXPECT_EQ(held[a->stage]--, 1) << to_string(*a);
        --active;
        ++evictions;
      } else if (a->type == ActionType::kF || a->type == ActionType::kB) {
        EXPECT_EQ(held[a->stage], 1) << "rank " << r << " computes " << to_string(*a) << " sharded";
      }
    }
    EXPECT_EQ(active, 0);
    EXPECT_GT(evictions, 4);  // more than one RESHARD per stage: some were evicted and fetched again
  }
}

TEST(Progress, BothRanksWaitingInTheirSendsIsACycleUnderRendezvousOnly) {
  const Schedule s = read_csv("0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
                              "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\n",
                              2, 2, true);
  EXPECT_TRUE(check_progress(s, SendSemantics::kEager).ok);
  const Progress p = check_progress(s, SendSemantics::kRendezvous);
  ASSERT_FALSE(p.ok);
  EXPECT_EQ(p.ranks, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(p.diagnosis,
            "pipeline deadlock under rendezvous sends: rank 0 waits in its send 0SEND_F1 (action 3) to rank 1 (1RECV_F1), "
            "while rank 1 waits in its send 1SEND_B0 (action 3) to rank 0 (0RECV_B0)");
  // A receive whose send never comes: the receiver is named, and the rank that ended without it.
  const Schedule lost = read_csv("0F0,0SEND_F0\n1RECV_F0,1F0,1RECV_F1\n", 2, 2, true);
  const Progress q = check_progress(lost, SendSemantics::kEager);
  ASSERT_FALSE(q.ok);
  EXPECT_EQ(q.ranks, (std::vector<int64_t>{1}));
  EXPECT_NE(q.diagnosis.find("rank 1 waits in its receive 1RECV_F1 (action 2) from rank 0"), std::string::npos) << q.diagnosis;
  EXPECT_NE(q.diagnosis.find("which has ended its schedule"), std::string::npos) << q.diagnosis;
}

TEST(ScheduleCsv, WrittenAndReadBackAndHostileCellsRefused) {
  const Schedule low = lower(one_f_one_b(4, 8));
  EXPECT_EQ(read_csv(write_csv(low), low.stages, low.microbatches, true), low);
  const Schedule idle = read_csv("0F0,,0B0\n1F0,1B0\n", 2, 1, false);
  EXPECT_FALSE(idle.ranks[0][1].has_value());
  EXPECT_NO_THROW(validate(idle));
  try {
    read_csv("0F0,0B0\n1F0,1X0\n", 2, 1, false);
    FAIL() << "read a bad cell";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("line 2 cell 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_csv("0F0,0SEND_F0\n", 2, 1, false), InvalidArgument);  // comms in a compute_only CSV
  EXPECT_THROW(read_csv("", 2, 1, false), InvalidArgument);
  // validate: a backward before its forward, a stage on another rank, a missing microbatch.
  EXPECT_THROW(validate(read_csv("0B0,0F0\n1F0,1B0\n", 2, 1, false)), InvalidArgument);
  EXPECT_THROW(validate(read_csv("1F0,1B0\n0F0,0B0\n", 2, 1, false)), InvalidArgument);
  EXPECT_THROW(validate(read_csv("0F0,0B0\n1F0,1B0\n", 2, 2, false)), InvalidArgument);
}

// ZBVZeroBubble, pp=2 (stages 0 and 3 on rank 0, 1 and 2 on rank 1), 4 microbatches, worked by
// hand from ScheduleZBVZeroBubble's rules (pytorch/pytorch 00722e648b, schedules.py).
TEST(BuiltinSchedules, ZbvZeroBubbleByPyTorchsRules) {
  const Schedule s = zbv_zero_bubble(2, 4);
  EXPECT_EQ(s.style, StageStyle::kV);
  EXPECT_EQ(s.stages, 4);
  EXPECT_EQ(row(s, 0), (std::vector<std::string>{"0F0", "0F1", "0F2", "3F0", "3I0", "3W0", "3F1", "3I1", "3W1", "0F3", "0I0",
                                                 "0W0", "3F2", "3I2", "3W2", "0I1", "0W1", "3F3", "3I3", "3W3", "0I2", "0W2",
                                                 "0I3", "0W3"}));
  EXPECT_EQ(row(s, 1), (std::vector<std::string>{"", "1F0", "2F0", "1F1", "2F1", "2I0", "2W0", "1F2", "1I0", "1W0", "2F2",
                                                 "2I1", "2W1", "1F3", "1I1", "1W1", "2F3", "2I2", "2W2", "1I2", "2I3", "1I3",
                                                 "1W2", "2W3", "1W3"}));
  // Fewer microbatches than 2 pp - 1: the ones past M are left idle.
  const Schedule few = zbv_zero_bubble(2, 2);
  for (const auto& r : few.ranks) {
    for (const auto& a : r) EXPECT_TRUE(!a || *a->microbatch < 2);
  }
  // At several sizes: PyTorch's validation holds, each rank holds stages r and 2 pp - 1 - r,
  // and the lowered schedule progresses under both send semantics.
  for (int64_t pp : {1, 2, 3, 4, 8}) {
    for (int64_t m : {1, 2, 5, 8, 16}) {
      SCOPED_TRACE(testing::Message() << "pp " << pp << " M " << m);
      const Schedule z = zbv_zero_bubble(pp, m);
      EXPECT_NO_THROW(validate(z));
      for (int64_t r = 0; r < pp; ++r) {
        for (const auto& a : z.ranks[static_cast<std::size_t>(r)]) {
          if (a) EXPECT_TRUE(a->stage == r || a->stage == 2 * pp - 1 - r) << to_string(*a);
        }
      }
      const Schedule lowered = lower(z);
      EXPECT_TRUE(check_progress(lowered, SendSemantics::kRendezvous).ok);
      EXPECT_TRUE(check_progress(lowered, SendSemantics::kEager).ok);
      // Written and read back, the "v" placement is recognised.
      EXPECT_EQ(read_csv(write_csv(lowered), 2 * pp, m, true), lowered);
    }
  }
  EXPECT_THROW(schedule_by_name("ZBVZeroBubble", 2, 6, 4), InvalidArgument);
}

// LoopedBFS, pp=2, 4 stages, 2 microbatches, by ScheduleLoopedBFS's rules.
TEST(BuiltinSchedules, LoopedBfsByPyTorchsRules) {
  const Schedule s = looped_bfs(2, 4, 2);
  EXPECT_EQ(row(s, 0), (std::vector<std::string>{"0F0", "0F1", "2F0", "2F1", "", "", "2B1", "2B0", "0B1", "0B0"}));
  EXPECT_EQ(row(s, 1), (std::vector<std::string>{"", "1F0", "1F1", "3F0", "3F1", "3B1", "3B0", "1B1", "1B0"}));
  for (int64_t pp : {2, 3, 4}) {
    for (int64_t m : {1, 3, 8}) {
      const Schedule lowered = lower(looped_bfs(pp, 2 * pp, m));
      EXPECT_TRUE(check_progress(lowered, SendSemantics::kRendezvous).ok) << pp << " " << m;
    }
  }
}

// InterleavedZeroBubble, pp=2, 4 stages, 2 microbatches, by ScheduleInterleavedZeroBubble's rules
// (warm-up factor 1, I and W, rank 1's first backward leaves its W for later; no bubble needed).
TEST(BuiltinSchedules, InterleavedZeroBubbleByPyTorchsRules) {
  const Schedule s = interleaved_zero_bubble(2, 4, 2);
  EXPECT_EQ(row(s, 0), (std::vector<std::string>{"0F0", "0F1", "2F0", "", "2F1", "2I0", "2W0", "2I1", "2W1", "0I0", "0W0",
                                                 "0I1", "0W1"}));
  EXPECT_EQ(row(s, 1), (std::vector<std::string>{"", "1F0", "1F1", "3F0", "3I0", "3F1", "3I1", "3W0", "1I0", "3W1", "1I1",
                                                 "1W0", "1W1"}));
  // The bubble pass's promise at several sizes: a forward of stage s > 0 runs at a later step
  // than stage s - 1's forward of its microbatch; and the schedule lowers and progresses.
  for (int64_t pp : {2, 3, 4}) {
    for (int64_t local : {2, 3}) {
      for (int64_t m : {int64_t{1}, int64_t{2}, pp, 2 * pp}) {
        SCOPED_TRACE(testing::Message() << "pp " << pp << " stages " << pp * local << " M " << m);
        const Schedule z = interleaved_zero_bubble(pp, pp * local, m);
        std::map<std::pair<int64_t, int64_t>, std::size_t> step_of;  // (stage, mb) -> step of its F
        for (const auto& r : z.ranks) {
          for (std::size_t k = 0; k < r.size(); ++k) {
            if (r[k] && r[k]->type == ActionType::kF) step_of[{r[k]->stage, *r[k]->microbatch}] = k;
          }
        }
        for (const auto& [key, k] : step_of) {
          if (key.first > 0) EXPECT_LT(step_of.at({key.first - 1, key.second}), k);
        }
        EXPECT_TRUE(check_progress(lower(z), SendSemantics::kRendezvous).ok);
      }
    }
  }
}

}  // namespace
}  // namespace meshsim::step

namespace meshsim::step {
namespace {

TEST(MegatronInterleaved, TheScheduleTableIsMegatrons) {
  // get_schedule_table(6, 2, 4): microbatches 0-3 through chunk 0 then chunk 1, then the last
  // group (4-5) the same way.
  const std::vector<std::pair<int64_t, int64_t>> want = {{0, 0}, {1, 0}, {2, 0}, {3, 0}, {0, 1}, {1, 1},
                                                         {2, 1}, {3, 1}, {4, 0}, {5, 0}, {4, 1}, {5, 1}};
  EXPECT_EQ(megatron_schedule_table(6, 2, 4), want);
  EXPECT_EQ(megatron_schedule_table(2, 3, 2), (std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {1, 0}, {0, 1}, {1, 1}, {0, 2}, {1, 2}}));
}

TEST(MegatronInterleaved, TwoRanksTwoChunksAsWorkedByHandFromMegatronsLoop) {
  // Worked from forward_backward_pipelining_with_interleaving (overlap_p2p_comm): rank 0 is all
  // warm-up (2 (pp - 1 - 0) + (chunks - 1) x pp = 4 = M x chunks), rank 1 warms up 2; each
  // call's operations in _p2p_ops's order (rank 0 even: sends first; rank 1 odd: receives first).
  const Schedule s = megatron_interleaved(2, 4, 2);
  EXPECT_TRUE(s.lowered);
  EXPECT_EQ(row(s, 0), (std::vector<std::string>{"0F0", "0SEND_F0", "0F1", "0SEND_F1", "2RECV_F0", "2F0", "2SEND_F0",
                                                 "2RECV_F1", "2F1", "2SEND_F1", "2RECV_B0", "2B0", "2SEND_B0", "2RECV_B1",
                                                 "2B1", "2SEND_B1", "0RECV_B0", "0B0", "0RECV_B1", "0B1"}));
  EXPECT_EQ(row(s, 1), (std::vector<std::string>{"1RECV_F0", "1F0", "1RECV_F1", "1SEND_F0", "1F1", "3RECV_F0", "1SEND_F1",
                                                 "3F0", "3RECV_F1", "3B0", "3SEND_B0", "3F1", "3B1", "1RECV_B0", "3SEND_B1",
                                                 "1B0", "1RECV_B1", "1SEND_B0", "1B1", "1SEND_B1"}));
  EXPECT_TRUE(check_progress(s, SendSemantics::kRendezvous).ok);
}

TEST(MegatronInterleaved, TheEvenOddRuleIsWhatKeepsRendezvousSendsFromDeadlocking) {
  for (int64_t pp : {2, 3, 4, 6, 8}) {
    for (int64_t chunks : {2, 3, 4}) {
      for (int64_t m : {pp, 2 * pp, 3 * pp}) {
        const Schedule s = megatron_interleaved(pp, pp * chunks, m);
        // Every stage runs each microbatch's forward and backward once, in order.
        Schedule compute = s;
        for (auto& l : compute.ranks) {
          std::erase_if(l, [](const std::optional<Action>& a) {
            return a && a->type != ActionType::kF && a->type != ActionType::kB;
          });
        }
        compute.lowered = false;
        EXPECT_NO_THROW(validate(compute)) << pp << " " << chunks << " " << m;
        const Progress ok = check_progress(s, SendSemantics::kRendezvous);
        EXPECT_TRUE(ok.ok) << pp << " " << chunks << " " << m << ": " << ok.diagnosis;
        // Every rank taking the even order: the sends to the next rank close the ring.
        std::vector<int64_t> all;
        for (int64_t r = 0; r < pp; ++r) all.push_back(r);
        const Progress stuck = check_progress(megatron_interleaved(pp, pp * chunks, m, 0, all), SendSemantics::kRendezvous);
        EXPECT_FALSE(stuck.ok) << pp << " " << chunks << " " << m;
        EXPECT_EQ(stuck.ranks, all) << stuck.diagnosis;
        EXPECT_NE(stuck.diagnosis.find("pipeline deadlock under rendezvous sends"), std::string::npos);
        // Eager sends never wait: the rule does not matter there.
        EXPECT_TRUE(check_progress(megatron_interleaved(pp, pp * chunks, m, 0, all), SendSemantics::kEager).ok);
      }
    }
  }
}

TEST(MegatronInterleaved, MegatronsRefusals) {
  EXPECT_THROW(megatron_interleaved(4, 6, 8), InvalidArgument);      // stages not a multiple of pp
  EXPECT_THROW(megatron_interleaved(4, 8, 3), InvalidArgument);      // fewer microbatches than pp
  EXPECT_THROW(megatron_interleaved(4, 8, 10), InvalidArgument);     // a last group of 2 < pp
  EXPECT_THROW(megatron_interleaved(4, 8, 8, 2), InvalidArgument);   // a group below pp
  EXPECT_THROW(megatron_interleaved(4, 8, 8, 16), InvalidArgument);  // a group above M
  EXPECT_NO_THROW(megatron_interleaved(4, 8, 12, 4));                // groups of 4, 4, 4
  EXPECT_NO_THROW(megatron_interleaved(4, 8, 10, 5));                // groups of 5 and 5
}

// One table holds the names: every check (the tool's --schedule, the typed job, the stage
// layout, Megatron's step) reads find_schedule. The names are PyTorch's schedule classes'
// (get_schedule_class: Schedule<Name>) and Megatron-core's interleaved schedule.
TEST(ScheduleTable, EveryNameIsReadFromOneTable) {
  const std::vector<std::string> pytorch = {"GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble",
                                            "ZBVZeroBubble"};
  for (const std::string& name : pytorch) {
    std::string upper = name;
    for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    for (const std::string& spelt : {name, upper}) {
      const ScheduleInfo* info = find_schedule(spelt);
      ASSERT_NE(info, nullptr) << spelt;
      EXPECT_EQ(info->name, name);
      EXPECT_TRUE(info->pytorch) << name;
      EXPECT_TRUE(known_schedule(spelt)) << spelt;
      const bool single = name == "GPipe" || name == "1F1B";
      EXPECT_EQ(info->single_stage, single) << name;
      EXPECT_EQ(is_single_stage(spelt), single) << name;
      // Built by name, a schedule PyTorch's rules accept.
      const Schedule s = schedule_by_name(spelt, 2, single ? 2 : 4, 4);
      EXPECT_NO_THROW(validate(s)) << name;
      EXPECT_EQ(s.stages, single ? 2 : 4) << name;
    }
    EXPECT_NE(schedule_names().find(name), std::string::npos) << name;
  }
  const ScheduleInfo* megatron = find_schedule("megatroninterleaved");
  ASSERT_NE(megatron, nullptr);
  EXPECT_EQ(megatron->kind, ScheduleKind::kMegatronInterleaved);
  EXPECT_FALSE(megatron->pytorch);
  EXPECT_FALSE(known_schedule("MegatronInterleaved"));
  EXPECT_THROW(schedule_by_name("MegatronInterleaved", 2, 4, 4), NotFound);
  EXPECT_EQ(schedule_names(true), "1F1B, Interleaved1F1B, MegatronInterleaved");
  EXPECT_EQ(schedule_names().find("Megatron"), std::string::npos);
  for (const char* unknown : {"", "DualPipeV", "1f1b ", "1F1", "gpipe\n", "ScheduleGPipe"}) {
    EXPECT_EQ(find_schedule(unknown), nullptr) << unknown;
    EXPECT_FALSE(known_schedule(unknown)) << unknown;
    try {
      schedule_by_name(unknown, 2, 2, 2);
      ADD_FAILURE() << unknown << " was built";
    } catch (const NotFound& e) {
      // The refusal names what is known, from the table.
      EXPECT_NE(std::string(e.what()).find(schedule_names()), std::string::npos) << e.what();
    }
  }
}

// The send semantics' one conversion: each name reads back to its value, and anything else (a
// case, a space, an empty text) is refused naming the value.
TEST(Schedule, SendSemanticsReadBackByName) {
  for (const SendSemantics s : {SendSemantics::kRendezvous, SendSemantics::kEager}) {
    EXPECT_EQ(parse_send_semantics(send_semantics_name(s)), s);
  }
  EXPECT_EQ(send_semantics_name(SendSemantics::kEager), "eager");
  for (const char* bad : {"Eager", " eager", "", "lazy", "rendezvous\n"}) {
    try {
      parse_send_semantics(bad);
      ADD_FAILURE() << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("--send-semantics must be rendezvous or eager"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace meshsim::step
