"""One training step of torchtitan 0.3.0's own Trainer (the llama3 debug model) on CPU processes
over Gloo, PyTorch's Flight Recorder on; run by tests/torch/test_step_real.py under torchrun:

  torchrun --standalone --nproc-per-node N step_real_job.py OUT [torchtitan's flags ...]

The job trains two steps. Each rank writes OUT/rank_<R>, the Flight Recorder buffer PyTorch dumps
(torch._C._distributed_c10d._dump_fr_trace()) after the second, its records of that step alone
(the first step holds the setup a steady step does not: the weights' broadcasts, and PyTorch's
pipeline schedules run a shape-inference forward of the first microbatch in their first step,
schedules.py _initialize_stage); rank 0 writes OUT/job.json, the resolved config as torchtitan
saves it (debug.save_config_file: to_dict as JSON), which `meshsim step --job` reads.

The Trainer, its model, parallelize_llama (TP with sequence and loss parallel, FSDP2 with bf16
parameters, HSDP), ChunkedLossWrapper, clip_grad_norm_ and the metrics run as torchtitan ships
them. What a CPU machine without the job's assets needs instead, none of which issues a
collective:
- torchtitan's model registry imports a Triton kernel module (its async expert parallel): stubbed;
- torchtitan takes the accelerator's device module (memory stats, device name): a CPU one;
- the tokenizer and the C4 dataset are downloaded assets: a tokenizer of the model's vocabulary
  and random token sequences with their positions (the dataloader's contract);
- FlexAttention has no backward on CPU: the attention kernel is PyTorch's causal SDPA (the
  masks torchtitan builds from the positions are causal over one document);
- Gloo has no PREMUL_SUM: FSDP's divide factor 1.0 (torchtitan disables FSDP's division) is
  reduced as SUM, the same numbers;
- torch.distributed.set_timeout (called after the first step) does not exist in 2.13: skipped;
- torchtitan 0.3.0 hands its pipeline schedule lists of microbatches
  (`step(arg_mbs=, kwarg_mbs=, target_mbs=)`, a newer PyTorch's API); PyTorch 2.13's schedules
  take a whole batch and split it, and run lists in `_step_microbatches`: the lists are passed
  there, after what 2.13's own `step` does first (each stage's runtime state cleared).
The SPMD backend is partial_dtensor: the default (spmd_types) stops in fully_shard on CPU
("all parameters must be DTensors on the full SPMD mesh").
"""
import json
import os
import pickle
import sys
import time
import types
import warnings


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import triton_stub  # noqa: E402

triton_stub.install()
warnings.simplefilter("ignore")

import torch  # noqa: E402
import torchtitan.tools.utils as tt_utils  # noqa: E402


class _CpuDeviceModule(types.ModuleType):
    def __getattr__(self, name):
        return getattr(torch.cpu, name)


_cpu = _CpuDeviceModule("cpu_device_module")
_cpu.get_device_name = lambda *a: "cpu"
_cpu.current_device = lambda: 0
_cpu.get_device_properties = lambda *a: types.SimpleNamespace(total_memory=1 << 34)
_cpu.reset_peak_memory_stats = _cpu.empty_cache = _cpu.set_device = lambda *a: None
_cpu.memory_stats = lambda *a: {}
tt_utils.device_type, tt_utils.device_module = "cpu", _cpu  # before torchtitan's modules import them

from torch.distributed.fsdp._fully_shard import _fsdp_collectives  # noqa: E402
from torchtitan.config.manager import ConfigManager  # noqa: E402
import torchtitan.distributed.utils as tt_dist  # noqa: E402
from torchtitan.models.common import attention  # noqa: E402

_divide = _fsdp_collectives._get_gradient_divide_factors


def _gloo_divide(rs, ar, dtype, device_type="", factor=None, force_sum_reduction_for_comms=False):
    if factor == 1.0:
        return None, None, _fsdp_collectives.ReduceOp.SUM, _fsdp_collectives.ReduceOp.SUM
    return _divide(rs, ar, dtype, device_type, factor, force_sum_reduction_for_comms)


_fsdp_collectives._get_gradient_divide_factors = _gloo_divide


def _causal_sdpa(q, k, v, *, score_mod=None, block_mask=None, scale=None, enable_gqa=False, return_aux=None,
                 kernel_options=None):
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=enable_gqa)
    return out, types.SimpleNamespace(lse=None)


attention.FlexAttention.compiled_flex_attn = staticmethod(_causal_sdpa)
tt_dist.set_pg_timeouts = lambda *a, **k: None

from torch.distributed.pipelining import schedules  # noqa: E402


def _list_step(step):
    def wrapped(self, *args, arg_mbs=None, kwarg_mbs=None, target_mbs=None, losses=None, return_outputs=True,
                loss_kwargs=None, **kwargs):
        if arg_mbs is None and kwarg_mbs is None and target_mbs is None:
            return step(self, *args, losses=losses, return_outputs=return_outputs, loss_kwargs=loss_kwargs, **kwargs)
        stages = getattr(self, "_stages", None) or [self._stage]
        for stage in stages:
            stage.has_backward = self._has_backward
            stage.clear_runtime_states()
        self._step_microbatches(arg_mbs, kwarg_mbs, target_mbs, losses, return_outputs, loss_kwargs=loss_kwargs)
        return None
    return wrapped


for _cls in (schedules.PipelineScheduleSingle, schedules.PipelineScheduleMulti):
    _cls.step = _list_step(_cls.step)


class _Tokenizer:
    eos_id = 0

    def __init__(self, vocab):
        self.vocab = vocab

    def encode(self, *a, **k):
        return [0]

    def decode(self, *a, **k):
        return ""

    def get_vocab_size(self):
        return self.vocab


class _Loader:
    def __init__(self, vocab, dp_rank, local_batch_size, seq_len, **_):
        self.vocab, self.b, self.s = vocab, local_batch_size, seq_len
        self.g = torch.Generator().manual_seed(1000 + dp_rank)

    def __iter__(self):
        while True:
            x = torch.randint(0, self.vocab, (self.b, self.s + 1), generator=self.g)
            positions = torch.arange(self.s).expand(self.b, self.s).contiguous()
            yield {"input": x[:, :-1], "positions": positions}, x[:, 1:]

    def state_dict(self):
        return {}

    def load_state_dict(self, sd):
        pass


def main():
    out = sys.argv[1]
    cfg = ConfigManager().parse_args(["--module", "llama3", "--config", "llama3_debugmodel",
                                      "--training.disable_cuda_graphs", "--training.steps", "2",
                                      "--parallelism.spmd_backend", "partial_dtensor", *sys.argv[2:]])
    rank = int(os.environ["RANK"])
    if rank == 0:
        with open(os.path.join(out, "job.json"), "w") as f:
            json.dump(cfg.to_dict(), f, default=str)
    vocab = cfg.model_spec.model.vocab_size
    cfg.tokenizer = types.SimpleNamespace(build=lambda **k: _Tokenizer(vocab))
    cfg.dataloader = types.SimpleNamespace(build=lambda **k: _Loader(vocab, **k))
    trainer = cfg.build()
    last_of_step = []
    train_step = trainer.train_step

    def counted_step(*args, **kwargs):
        result = train_step(*args, **kwargs)
        entries = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())["entries"]
        last_of_step.append(max((e["record_id"] for e in entries), default=-1))
        return result

    trainer.train_step = counted_step
    trainer.train()
    time.sleep(0.5)  # Gloo retires the last records after the caller's wait returns
    dump = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())
    dump["entries"] = [e for e in dump["entries"] if e["record_id"] > last_of_step[0]]
    with open(os.path.join(out, f"rank_{rank}"), "wb") as f:
        pickle.dump(dump, f)
    trainer.close()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
