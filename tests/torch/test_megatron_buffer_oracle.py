"""meshsim's Megatron step against megatron-core's own distributed-optimizer buffer (megatron-core
0.16.1 of the project's .venv), built on CPU.

For random Megatron-LM jobs (MESHSIM_TORCH_SEED picks them: tp, pp, dp, the model's shape), each
pipeline stage's first rank builds the real model chunk the way Megatron-LM's `get_model` does:
`parallel_state.initialize_model_parallel` over the `fake` backend, megatron-core's `GPTModel`
(its local layer spec: no Transformer Engine on CPU) with that stage's layers, wrapped in
`Float16Module` (`--bf16` makes every parameter bf16) and in `DistributedDataParallel` with the
distributed optimizer and fp32 gradient reduction (what `--bf16` without `--grad-reduce-in-bf16`
sets). Its gradient buffer (every parameter laid out, 64-aligned, padded to lcm(dp, 128)) must be
what `meshsim step --megatron-args` reduce-scatters over dp_cp for that rank, in fp32 bytes, and
gathers in bf16. With --grad-reduce-in-bf16 the buffer's gradients are bf16, and so are meshsim's.
The model takes Megatron-LM's defaults, biases in every linear layer and LayerNorm, or what the
job's flags say (--disable-bias-linear, --add-qkv-bias, --normalization RMSNorm): the buffer holds
every bias and norm, and the sequence-parallel parameters (the norms, the row-parallel biases)
are what meshsim all-reduces over tp at the step's end.

And megatron-core's own `TransformerConfig.__post_init__` against `--megatron-args`: for random
jobs over the settings it checks (tensor parallel against heads and query groups, the
recomputation's granularity, method and layer count, MoE experts, top-k, the router's score
function and pre-softmax, biases, the norm), when TransformerConfig refuses the job's config,
meshsim refuses the flags; when it accepts, meshsim accepts, or refuses naming what it does not
model, never calling it Megatron's refusal ("[Megatron]").

Only `torch.cuda.current_device` is patched (to "cpu"): the buffers are allocated there; nothing
runs on them.
"""
import json
import logging
import os
import random
import warnings

import pytest

torch = pytest.importorskip("torch", reason="PyTorch 2.13 (the project's .venv) is the oracle")
pytest.importorskip("megatron.core", reason="megatron-core (the project's .venv) is the oracle")

import torch.distributed as dist  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

import meshsim  # noqa: E402

warnings.simplefilter("ignore")
logging.disable(logging.CRITICAL)

RNG = random.Random(int(os.environ.get("MESHSIM_TORCH_SEED", "58")))
COUNT = max(8, int(os.environ.get("MESHSIM_TORCH_EXAMPLES", "200")) // 12)


def jobs():
    out = []
    while len(out) < COUNT:
        j = {"tp": RNG.choice([1, 2]), "pp": RNG.choice([1, 2]), "dp": RNG.choice([2, 4]),
             "layers": RNG.choice([2, 4]), "hidden": RNG.choice([128, 256]), "heads": RNG.choice([4, 8]),
             "ffn": RNG.choice([384, 512]), "vocab": RNG.choice([1000, 2048]), "bf16_reduce": RNG.random() < 0.25}
        j["groups"] = RNG.choice([j["heads"], j["heads"] // 2])
        j["bias"] = RNG.random() < 0.5
        j["qkv_bias"] = not j["bias"] and RNG.random() < 0.5
        j["norm"] = RNG.choice(["LayerNorm", "RMSNorm"])
        j["norm_flag"] = j["norm"] == "RMSNorm" or RNG.random() < 0.3  # LayerNorm given or left to the default
        out.append(j)
    return out


def args(j):
    text = (f"--tensor-model-parallel-size {j['tp']} --pipeline-model-parallel-size {j['pp']} --micro-batch-size 1 "
            f"--global-batch-size {j['dp'] * j['pp']} --seq-length 256 --bf16 --use-distributed-optimizer "
            f"--num-layers {j['layers']} --hidden-size {j['hidden']} --ffn-hidden-size {j['ffn']} "
            f"--num-attention-heads {j['heads']} --group-query-attention --num-query-groups {j['groups']} --swiglu "
            f"--vocab-size {j['vocab']} --untie-embeddings-and-output-weights")
    if j["tp"] > 1:
        text += " --sequence-parallel"
    if j["bf16_reduce"]:
        text += " --grad-reduce-in-bf16"
    if not j["bias"]:
        text += " --disable-bias-linear"
    if j["qkv_bias"]:
        text += " --add-qkv-bias"
    if j["norm_flag"]:
        text += " --normalization " + j["norm"]
    return text


def megatron_buffer(j, rank, monkeypatch):
    """(elements, gradient dtype, sequence-parallel elements) of megatron-core's DDP buffer on `rank`."""
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.module import Float16Module

    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    world = j["tp"] * j["pp"] * j["dp"]
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        ps.initialize_model_parallel(tensor_model_parallel_size=j["tp"], pipeline_model_parallel_size=j["pp"],
                                     create_gloo_process_groups=False)
        cfg = TransformerConfig(num_layers=j["layers"], hidden_size=j["hidden"], ffn_hidden_size=j["ffn"],
                                num_attention_heads=j["heads"], num_query_groups=j["groups"],
                                tensor_model_parallel_size=j["tp"], pipeline_model_parallel_size=j["pp"],
                                bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16, gated_linear_unit=True,
                                add_bias_linear=j["bias"], add_qkv_bias=j["qkv_bias"], normalization=j["norm"],
                                use_cpu_initialization=True)
        # Megatron-LM pads the vocabulary to a multiple of 128 x tp before building the model
        # (training/tokenizer: _vocab_size_with_padding, make_vocab_size_divisible_by 128).
        step = 128 * j["tp"]
        vocab = (j["vocab"] + step - 1) // step * step
        model = GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(normalization=j["norm"]),
                         vocab_size=vocab, max_sequence_length=256, share_embeddings_and_output_weights=False,
                         position_embedding_type="rope", pre_process=ps.is_pipeline_first_stage(),
                         post_process=ps.is_pipeline_last_stage())
        ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=True,
                                                   grad_reduce_in_fp32=not j["bf16_reduce"])
        ddp = DistributedDataParallel(cfg, ddp_config, Float16Module(cfg, model))
        assert len(ddp.buffers) == 1 and not ddp.expert_parallel_buffers
        b = ddp.buffers[0]
        assert b.param_dtype == torch.bfloat16
        # What finalize_model_grads all-reduces over tp (_allreduce_non_tensor_model_parallel_grads):
        # the parameters marked sequence_parallel. On CPU the norms are WrappedTorchNorm, which refuses
        # sequence_parallel, so the config leaves it off and the marked ones are named by the modules
        # that mark them with it on: a norm's weight and bias (FusedLayerNorm, TENorm) and
        # RowParallelLinear's bias (tensor_parallel/layers.py).
        marked = ("layernorm.weight", "layernorm.bias", "linear_proj.bias", "linear_fc2.bias")
        sp = sum(p.numel() for n, p in model.named_parameters() if n.endswith(marked)) if j["tp"] > 1 else 0
        return b.numel, b.grad_dtype, sp
    finally:
        ps.destroy_model_parallel()
        dist.destroy_process_group()


@pytest.mark.parametrize("j", jobs(), ids=lambda j: ",".join(f"{k}={v}" for k, v in j.items()))
def test_each_stages_buffer_is_megatron_cores(j, monkeypatch):
    world = j["tp"] * j["pp"] * j["dp"]
    for stage in range(j["pp"]):
        rank = stage * j["tp"] * j["dp"]  # the stage's first rank (Megatron's order tp-cp-ep-dp-pp)
        numel, grad_dtype, sp = megatron_buffer(j, rank, monkeypatch)
        mine = meshsim.step(megatron_args=args(j), world_size=world, rank=rank, trace=True)
        width = 2 if j["bf16_reduce"] else 4
        trace = mine["trace"] if isinstance(mine["trace"], dict) else json.loads(mine["trace"])
        norm_grads = [e["args"]["bytes"] for e in trace["traceEvents"]
                      if e.get("ph") == "X" and e["tid"] == rank and e["args"].get("what") == "norm_grads"]
        assert norm_grads == ([sp * width] if sp else []), (stage, sp, norm_grads)
        assert grad_dtype == (torch.bfloat16 if j["bf16_reduce"] else torch.float32)
        assert mine["by_dim"]["dp_cp"]["reduce_scatter"] == {"calls": 1, "bytes": numel * width}, (stage, numel)
        assert mine["by_dim"]["dp_cp"]["all_gather"] == {"calls": 1, "bytes": numel * 2}, (stage, numel)


def tc_jobs():
    rng = random.Random(int(os.environ.get("MESHSIM_TORCH_SEED", "58")) + 1)
    out = []
    for _ in range(max(60, COUNT * 6)):
        j = {"tp": rng.choice([1, 2, 4]), "heads": rng.choice([4, 6, 8]), "hidden": rng.choice([96, 128, 256]),
             "layers": rng.choice([2, 4]), "ep": rng.choice([1, 2])}
        j["groups"] = rng.choice([j["heads"], j["heads"] // 2, 3])
        j["gran"] = rng.choice([None, "full", "selective"])
        j["method"] = rng.choice([None, "block", "uniform"])
        j["nlayers"] = rng.choice([None, 1, 2, 0])
        j["experts"] = rng.choice([None, None, 4, 6])
        j["topk"] = rng.choice([1, 2, 8])
        j["pre_softmax"] = rng.random() < 0.3
        j["score"] = rng.choice([None, "softmax", "sigmoid"])
        j["bias"] = rng.random() < 0.4
        j["norm"] = rng.choice(["LayerNorm", "RMSNorm"])
        out.append(j)
    return out


def tc_flags(j):
    t = (f"--tensor-model-parallel-size {j['tp']} --micro-batch-size 1 --global-batch-size 4 --seq-length 256 --bf16 "
         f"--use-distributed-optimizer --num-layers {j['layers']} --hidden-size {j['hidden']} --ffn-hidden-size 512 "
         f"--num-attention-heads {j['heads']} --group-query-attention --num-query-groups {j['groups']} --swiglu "
         f"--vocab-size 1024 --untie-embeddings-and-output-weights --normalization {j['norm']}")
    if j["tp"] > 1:
        t += " --sequence-parallel"
    if not j["bias"]:
        t += " --disable-bias-linear"
    for flag, key in (("--recompute-granularity", "gran"), ("--recompute-method", "method"), ("--recompute-num-layers", "nlayers")):
        if j[key] is not None:
            t += f" {flag} {j[key]}"
    if j["experts"]:
        t += f" --num-experts {j['experts']} --moe-router-topk {j['topk']} --expert-model-parallel-size {j['ep']}"
        if j["pre_softmax"]:
            t += " --moe-router-pre-softmax"
        if j["score"]:
            t += f" --moe-router-score-function {j['score']}"
    return t


def transformer_config_refusal(j):
    """What megatron-core's TransformerConfig says of the config Megatron-LM builds from the flags
    (core_transformer_config_from_args copies each argument of a field's name): None if it
    accepts."""
    from megatron.core.transformer import TransformerConfig
    kw = dict(num_layers=j["layers"], hidden_size=j["hidden"], num_attention_heads=j["heads"], num_query_groups=j["groups"],
              ffn_hidden_size=512, tensor_model_parallel_size=j["tp"], sequence_parallel=j["tp"] > 1,
              add_bias_linear=j["bias"], normalization=j["norm"], gated_linear_unit=True, bf16=True,
              params_dtype=torch.bfloat16, recompute_granularity=j["gran"], recompute_method=j["method"],
              recompute_num_layers=j["nlayers"])
    if j["experts"]:
        kw.update(num_moe_experts=j["experts"], moe_router_topk=j["topk"], expert_model_parallel_size=j["ep"],
                  moe_router_pre_softmax=j["pre_softmax"], moe_router_score_function=j["score"] or "softmax")
    try:
        TransformerConfig(**kw)
        return None
    except (ValueError, AssertionError) as e:
        return f"{type(e).__name__}: {e}"


def test_transformer_configs_own_refusals_are_meshsims():
    refused = mismatches = 0
    for j in tc_jobs():
        theirs = transformer_config_refusal(j)
        try:
            meshsim.step(megatron_args=tc_flags(j), world_size=j["tp"] * 4)
            mine = None
        except meshsim.errors.Error as e:
            mine = str(e)
        refused += theirs is not None
        if theirs is not None and mine is None or theirs is None and mine is not None and "[Megatron]" in mine:
            mismatches += 1
            print("MISMATCH", j, "\n  TransformerConfig:", theirs, "\n  meshsim:", mine)
    assert mismatches == 0
    assert refused >= 10  # the random jobs reach TransformerConfig's refusals
