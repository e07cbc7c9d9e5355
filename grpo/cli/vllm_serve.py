"""`grpo vllm-serve`: vLLM's OpenAI-compatible server, in this process, set up for a trainer's weight updates
(TRL's `trl vllm-serve`); the trainer side is grpo/rollout/engines/vllm_server.py."""

from __future__ import annotations

import argparse
import os
import sys

from grpo.config import ConfigError

DESCRIPTION = """\
Start vLLM's OpenAI-compatible server (vLLM's own server, in this process) for
  grpo train --rollout.engine vllm --rollout.vllm.mode server
which generates here and pushes the policy's weights after every update. Set up for that:
  VLLM_SERVER_DEV_MODE=1          vLLM's dev routes: /collective_rpc (the weight load), /reset_prefix_cache
  --logprobs-mode processed_logprobs   a token's log-prob after temperature / top-k / top-p, as sampled
  --worker-extension-cls grpo...  grpo's weight loader in vLLM's workers (weights from a file on CPU)
  --weight-transfer-config '{"backend": "nccl"}'   on a CUDA machine: weights over NCCL
  --no-enable-chunked-prefill     on CPU: a chunked prefill of a seeded request kills vLLM 0.32's CPU engine
  --host 127.0.0.1                the dev routes run code: give --host 0.0.0.0 only on a trusted network
Every other flag goes to vLLM as given (--port, default 8000; --dtype; --max-model-len; --tensor-parallel-size;
--gpu-memory-utilization; ...: --vllm-help lists them). On CPU, VLLM_CPU_KVCACHE_SPACE (GiB) sizes the KV cache.
Needs vLLM installed in this environment."""

EPILOG = """\
Example:
  grpo vllm-serve --model Qwen/Qwen2.5-0.5B-Instruct --port 8000 --max-model-len 2048
  grpo train --model Qwen/Qwen2.5-0.5B-Instruct --rollout.engine vllm --rollout.vllm.mode server \\
      --rollout.vllm.server_port 8000
"""

NCCL = '{"backend": "nccl"}'


def add_parser(sub) -> None:
    p = sub.add_parser("vllm-serve", help="Start a vLLM server the trainer generates with (rollout.vllm.mode "
                                          "server; TRL's vllm-serve); unknown flags go to vLLM.",
                       description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="Model directory or hub id, the trainer's model.path (default: the embedded "
                                   "base policy, as grpo train's).")
    p.add_argument("--vllm-help", dest="vllm_help", action="store_true", help="Print vLLM's own server flags.")
    p.set_defaults(func=cmd_vllm_serve)


def _given(extra: list[str]) -> dict[str, str | None]:
    """vLLM flags in `extra` -> their value (None for a bare flag), names spelt with dashes."""
    out: dict[str, str | None] = {}
    for i, tok in enumerate(extra):
        if tok.startswith("--"):
            name, eq, value = tok.partition("=")
            following = extra[i + 1] if i + 1 < len(extra) and not extra[i + 1].startswith("--") else None
            out[name.replace("_", "-")] = value if eq else following
    return out


def serve_argv(model: str, extra: list[str], cuda: bool) -> list[str]:
    """vLLM's server arguments: `extra` as given, and what a trainer's weight updates need (DESCRIPTION)."""
    from grpo.rollout.engines.vllm_transport import EXTENSION

    given = _given(extra)
    mode = given.get("--logprobs-mode", "processed_logprobs")
    if mode != "processed_logprobs":
        raise ConfigError(f"grpo vllm-serve serves processed log-probs (the trainer's sampling log-probs), not "
                          f"--logprobs-mode {mode}: leave the flag out")
    extension = given.get("--worker-extension-cls", EXTENSION)
    if extension != EXTENSION:
        raise ConfigError(f"grpo vllm-serve needs its own --worker-extension-cls ({EXTENSION}), not {extension}: "
                          "leave the flag out")
    argv = ["--model", model, "--logprobs-mode", "processed_logprobs", "--worker-extension-cls", EXTENSION]
    if "--host" not in given:
        argv += ["--host", "127.0.0.1"]
    if cuda and "--weight-transfer-config" not in given:
        argv += ["--weight-transfer-config", NCCL]
    if not cuda:
        if "--enable-chunked-prefill" in given:
            raise ConfigError("grpo vllm-serve on CPU cannot chunk prefills: vLLM 0.32's CPU engine dies on a chunked "
                              "prefill of a seeded request (CPU Generator does not use offset): leave "
                              "--enable-chunked-prefill out")
        if "--no-enable-chunked-prefill" not in given:
            argv.append("--no-enable-chunked-prefill")   # vLLM then sizes a step's token budget to max_model_len
    drop = {"--logprobs-mode", "--worker-extension-cls"}
    kept, skip = [], False
    for tok in extra:
        if skip:
            skip = False
            continue
        name, eq, _ = tok.partition("=")
        if name.replace("_", "-") in drop:
            skip = not eq and given.get(name.replace("_", "-")) is not None
            continue
        kept.append(tok)
    return argv + kept


def _vllm_parser():
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser(prog="grpo vllm-serve",
                                                  description="vLLM's server flags (grpo vllm-serve passes them on)."))


def cmd_vllm_serve(args: argparse.Namespace, extra: list[str]) -> int:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        print(f"error: vLLM is not installed in this environment ({sys.executable}): install it, or run grpo "
              "vllm-serve from the environment that has it", file=sys.stderr)
        return 2
    os.environ["VLLM_SERVER_DEV_MODE"] = "1"            # before vLLM reads its environment
    if args.vllm_help:
        _vllm_parser().print_help()
        return 0
    import torch

    from grpo.modeling.models import EMBEDDED_MODEL_DIR

    argv = serve_argv(args.model or str(EMBEDDED_MODEL_DIR), extra, torch.cuda.is_available())
    import uvloop
    from vllm.entrypoints.launchers.api_server.entry import run_server
    from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args

    cli_env_setup()                                     # as vLLM's own entry point: spawned workers
    served = _vllm_parser().parse_args(argv)
    configure_logging_from_args(served)
    validate_parsed_serve_args(served)
    print(f"grpo: vllm-serve {' '.join(argv)}", flush=True)
    uvloop.run(run_server(served))
    return 0
