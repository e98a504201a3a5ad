"""`meshsim step --job` on the config torchtitan itself resolves and saves (torchtitan 0.3.0 of the
project's .venv), against torchtitan's own reading of it.

For random jobs (MESHSIM_TORCH_SEED picks them), torchtitan's ConfigManager parses the llama3
debug model's registry config with the overrides a user gives on its command line, and the
resolved config is written as torchtitan writes it under `debug.save_config_file` (to_dict as
JSON). meshsim reads that file, and
- its degrees, schedule, reshard policy and activation checkpointing are the file's;
- its stage count is torchtitan's own `_get_pipeline_metadata` (pipeline_parallel.py) for the
  same parallelism and model, and a layer split torchtitan refuses, meshsim refuses;
- its pipeline microbatches and gradient accumulation steps are torchtitan's rules (local batch
  over microbatch size; global batch over local batch times the batch degree);
- the report equals `meshsim step` given the same job as flags, and a flag given beside the file
  overrides it and says so in the report's notes.
And mutations of the config torchtitan saved (a key misspelled in any section, a value of another
type, null, a Literal's value outside its choices, a valid new value), each given to torchtitan's
own parser as the same change on its command line: both refuse, or both accept with the same step.

torchtitan's model registry imports a Triton kernel module at import time (its async expert
parallel), which a CPU build lacks: only that module is stubbed, and no code of it runs here.
"""
import contextlib
import io
import json
import logging
import os
import random
import sys
import warnings

import pytest

pytest.importorskip("torch", reason="PyTorch 2.13 (the project's .venv) is the oracle")
pytest.importorskip("torchtitan", reason="torchtitan (the project's .venv) is the oracle")


sys.path.insert(0, os.path.dirname(__file__))
import triton_stub  # noqa: E402

triton_stub.install()
warnings.simplefilter("ignore")
logging.disable(logging.CRITICAL)

from torchtitan.config.manager import ConfigManager  # noqa: E402
from torchtitan.distributed import ParallelDims  # noqa: E402
from torchtitan.distributed.pipeline_parallel import _get_pipeline_metadata  # noqa: E402

import meshsim  # noqa: E402

RNG = random.Random(int(os.environ.get("MESHSIM_TORCH_SEED", "57")))
COUNT = max(12, int(os.environ.get("MESHSIM_TORCH_EXAMPLES", "200")) // 6)


def jobs():
    out = []
    while len(out) < COUNT:
        d = {"pp": RNG.choice([1, 2, 2]), "dp_shard": RNG.choice([1, 2]), "dp_replicate": RNG.choice([1, 1, 2]),
             "tp": RNG.choice([1, 2])}
        if d["pp"] * d["dp_shard"] * d["dp_replicate"] * d["tp"] < 2:
            continue
        d["local"] = RNG.choice([2, 4, 8])
        d["mbs"] = RNG.choice([1, 2, 3])
        d["accum"] = RNG.choice([None, 1, 2])
        d["seq"] = RNG.choice([256, 512])
        d["schedule"] = RNG.choice(["1F1B", "GPipe", "Interleaved1F1B"])
        d["lps"] = RNG.choice([None, None, 1, 2, 3, 4])
        d["reshard"] = RNG.choice(["default", "always", "never"])
        out.append(d)
    return out


def job_id(d):
    return ",".join(f"{k}={v}" for k, v in d.items())


def torchtitan_config(d):
    dp = d["dp_shard"] * d["dp_replicate"]
    args = ["--module", "llama3", "--config", "llama3_debugmodel", "--training.disable_cuda_graphs",
            "--parallelism.pipeline_parallel_degree", str(d["pp"]),
            "--parallelism.data_parallel_shard_degree", str(d["dp_shard"]),
            "--parallelism.data_parallel_replicate_degree", str(d["dp_replicate"]),
            "--parallelism.tensor_parallel_degree", str(d["tp"]),
            "--training.local_batch_size", str(d["local"]),
            "--training.seq_len", str(d["seq"]),
            "--parallelism.pipeline_parallel_microbatch_size", str(d["mbs"]),
            "--parallelism.pipeline_parallel_schedule", d["schedule"],
            "--parallelism.fsdp_reshard_after_forward", d["reshard"]]
    if d["accum"] is not None:
        args += ["--training.global_batch_size", str(d["local"] * dp * d["accum"])]
    if d["lps"] is not None:
        args += ["--parallelism.pipeline_parallel_layers_per_stage", str(d["lps"])]
    return ConfigManager().parse_args(args)


def saved(config, tmp_path):
    # As Trainer.maybe_log writes debug.save_config_file (json.dump of to_dict); the model's
    # init functions are not JSON, so they are written as their text.
    path = tmp_path / "job_config.json"
    path.write_text(json.dumps(config.to_dict(), indent=2, default=str))
    return str(path)


@pytest.mark.parametrize("d", jobs(), ids=job_id)
def test_the_saved_config_means_to_meshsim_what_it_means_to_torchtitan(d, tmp_path):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
            config = torchtitan_config(d)
    except SystemExit:
        # torchtitan's parser refuses a local batch its microbatch size does not divide; the
        # same config with that one value written in must be refused by meshsim too.
        text = " ".join(err.getvalue().replace("│", " ").split())
        assert "must be evenly divisible by parallelism.pipeline_parallel_microbatch_size" in text, text
        config = torchtitan_config(dict(d, mbs=1)).to_dict()
        config["parallelism"]["pipeline_parallel_microbatch_size"] = d["mbs"]
        path = tmp_path / "refused.json"
        path.write_text(json.dumps(config, default=str))
        with pytest.raises(meshsim.errors.InvalidArgument, match="is not divisible by parallelism.pipeline_parallel_microbatch_size"):
            meshsim.step(job=str(path))
        return
    path = saved(config, tmp_path)
    par, training = config.parallelism, config.training
    world = d["pp"] * d["dp_shard"] * d["dp_replicate"] * d["tp"]
    # torchtitan's readings of the same config.
    theirs_error = None
    stages = None
    if d["pp"] > 1:
        pd = ParallelDims(dp_replicate=d["dp_replicate"], dp_shard=d["dp_shard"], cp=1, tp=d["tp"], pp=d["pp"], ep=1,
                          world_size=world)
        try:
            stages = _get_pipeline_metadata(pd, par, config.model_spec.model)[0]
        except ValueError as e:
            theirs_error = e
        # PyTorch's Schedule1F1B refuses fewer microbatches than stages when torchtitan builds it
        # (torchtitan only warns first); torch:schedules holds that refusal to PyTorch's own.
        microbatches = training.local_batch_size // par.pipeline_parallel_microbatch_size
        if theirs_error is None and par.pipeline_parallel_schedule == "1F1B" and microbatches < stages:
            theirs_error = ValueError(f"{par.pipeline_parallel_schedule}: {microbatches} microbatches < {stages} stages")
    if d["pp"] > 1 and d["reshard"] == "always" and theirs_error is None:
        # meshsim's own limit (docs/step.md): FSDP's gathers between microbatches are not modelled.
        with pytest.raises(meshsim.errors.InvalidArgument, match="reshard_after_forward 'always' with pp > 1"):
            meshsim.step(job=path)
        return
    try:
        mine = meshsim.step(job=path, log_metrics=True)
    except meshsim.errors.InvalidArgument as e:
        assert theirs_error is not None, f"meshsim refused what torchtitan accepts: {e}"
        return
    assert theirs_error is None, f"torchtitan refused ({theirs_error}); meshsim accepted"
    batch = d["dp_shard"] * d["dp_replicate"]
    gbs = training.global_batch_size if training.global_batch_size > 0 else training.local_batch_size * batch
    assert mine["gradient_accumulation_steps"] == gbs // (training.local_batch_size * batch)
    assert mine["parallel"] == {"pp": d["pp"], "dp_replicate": d["dp_replicate"], "dp_shard": d["dp_shard"], "cp": 1,
                                "tp": d["tp"], "ep": 1}
    assert mine["model"]["name"] == "llama3-debugmodel"
    assert mine["model"]["layers"] == len(config.model_spec.model.layers)
    assert mine["activation_checkpoint"] == "selective"  # the registry's SelectiveAC
    assert mine["loss_chunks"] == config.loss.num_chunks
    if d["pp"] > 1:
        assert mine["stages"] == stages
        assert mine["microbatches"] == training.local_batch_size // par.pipeline_parallel_microbatch_size
        assert mine["schedule"] == par.pipeline_parallel_schedule
    # The same job as flags means the same step.
    flags = dict(preset="torchtitan:" + ",".join(f"{k}={d[k]}" for k in ("pp", "dp_shard", "dp_replicate", "tp")),
                 model="llama3-debugmodel", seq_len=d["seq"],
                 local_batch_size=d["mbs"] if d["pp"] > 1 else d["local"], reshard_after_forward=d["reshard"],
                 loss_chunks=config.loss.num_chunks)
    if d["pp"] > 1:
        flags.update(microbatches=mine["microbatches"], schedule=d["schedule"], stages=stages)
    if mine["gradient_accumulation_steps"] == 1:
        by_flags = meshsim.step(**flags)
        for k in ("by_dim", "events", "stages", "microbatches", "layers_per_stage"):
            assert mine[k] == by_flags[k], k
    # A flag beside the file overrides it, and says so.
    over = meshsim.step(job=path, seq_len=2 * d["seq"])
    assert over["notes"][0].startswith(f"--seq-len {2 * d['seq']} overrides training.seq_len = {d['seq']}")
    if d["tp"] > 1:  # sequence-parallel collectives move seq_len's tokens
        assert over["by_dim"]["tp"] != mine["by_dim"]["tp"]


# Mutations of a saved config, each held to torchtitan's own parser (tyro over the config's
# dataclasses, then its validation), as the same change given on torchtitan's command line:
# a key misspelled, a value of another type, null, a Literal's value outside its choices, a
# valid new value. Both refuse, or both accept with the same step. The checkpointing policy and
# the loss (subcommands and nested configs on torchtitan's command line) and null in a plain str
# field (the command line's "None" is that string there, not None) are not mutated here;
# tests/job_file_test.cpp holds those.
MUTATED_SECTIONS = ("training", "parallelism", "checkpoint", "compile", "comm", "debug", "metrics", "profiler",
                    "lr_scheduler", "dataloader", "validator", "optimizer")


def mutations(seed, count):
    rng = random.Random(seed)
    return [(rng.choice(MUTATED_SECTIONS), rng.random(), rng.choice(["misspell", "type", "null", "choice", "valid"]),
             rng.random()) for _ in range(count)]


MUTATED_JOBS = jobs()


def torchtitan_verdict(d, extra):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
            config = torchtitan_config_with(d, extra)
        return config, None
    except (SystemExit, ValueError, TypeError) as e:
        return None, f"{type(e).__name__}: {' '.join(err.getvalue().split())[-200:]}"


def torchtitan_config_with(d, extra):
    dp = d["dp_shard"] * d["dp_replicate"]
    args = ["--module", "llama3", "--config", "llama3_debugmodel", "--training.disable_cuda_graphs",
            "--parallelism.data_parallel_shard_degree", str(d["dp_shard"]),
            "--parallelism.data_parallel_replicate_degree", str(d["dp_replicate"]),
            "--parallelism.tensor_parallel_degree", str(d["tp"]), "--training.local_batch_size", str(d["local"] * dp),
            "--training.seq_len", str(d["seq"])]
    return ConfigManager().parse_args(args + extra)


@pytest.mark.parametrize("seed", range(max(2, COUNT // 6)))
def test_a_mutated_saved_config_is_refused_or_read_as_torchtitan_does(seed, tmp_path):
    d = MUTATED_JOBS[seed % len(MUTATED_JOBS)]
    base_config, err = torchtitan_verdict(d, [])
    assert err is None, err
    base = json.loads(json.dumps(base_config.to_dict(), default=str))
    tried = agreed_refusals = 0
    for section, pick, kind, r in mutations(seed, 16):
        leaves = [(k, v) for k, v in base[section].items() if v is None or isinstance(v, (bool, int, float, str))]
        if not leaves:
            continue
        key, value = leaves[int(pick * len(leaves))]
        mutated = json.loads(json.dumps(base))
        cli = None
        if kind == "misspell":
            bad = key + ("_x" if r < 0.5 else "s")
            mutated[section][bad] = mutated[section].pop(key)
            cli = [f"--{section}.{bad}", "1"]
        elif kind == "type" and isinstance(value, bool):
            mutated[section][key] = "maybe"
            cli = [f"--{section}.{key}", "maybe"]
        elif kind == "type" and isinstance(value, int):
            mutated[section][key] = 2.5 if r < 0.5 else "abc"
            cli = [f"--{section}.{key}", str(mutated[section][key])]
        elif kind == "type" and isinstance(value, float):
            mutated[section][key] = "abc"
            cli = [f"--{section}.{key}", "abc"]
        elif kind == "null" and value is not None and not isinstance(value, str):
            mutated[section][key] = None
            cli = [f"--{section}.{key}", "None"]
        elif kind == "choice" and isinstance(value, str):
            mutated[section][key] = "bogus_choice"
            cli = [f"--{section}.{key}", "bogus_choice"]
        elif kind == "valid" and isinstance(value, int) and not isinstance(value, bool) and "degree" not in key:
            mutated[section][key] = value + 1
            cli = [f"--{section}.{key}", str(value + 1)]
        if cli is None:
            continue
        tried += 1
        theirs, why = torchtitan_verdict(d, cli)
        path = tmp_path / f"m{tried}.json"
        path.write_text(json.dumps(mutated))
        what = f"{kind} {section}.{key}={value!r} ({' '.join(cli)})"
        try:
            mine = meshsim.step(job=str(path))
        except meshsim.errors.InvalidArgument as e:
            assert why is not None, f"{what}: meshsim refused what torchtitan accepts: {e}"
            agreed_refusals += 1
            continue
        assert why is None, f"{what}: torchtitan refused ({why}); meshsim accepted"
        # Both accept: the same step as torchtitan's own config of that change, saved.
        again = tmp_path / f"t{tried}.json"
        again.write_text(json.dumps(theirs.to_dict(), default=str))
        assert mine["by_dim"] == meshsim.step(job=str(again))["by_dim"], what
    assert tried >= 5, "too few mutations applied: the test no longer tests"
    print(f"seed {seed}: {tried} mutations, {agreed_refusals} refused by both")
