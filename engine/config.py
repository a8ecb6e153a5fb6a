"""EngineConfig: everything an engine is built with (validated here, never mutated), and the
device and runner it resolves to."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from interlock.protocol.errors import DeviceUnavailableError, UnsupportedModelError
from interlock.protocol.grammar import GrammarConfig
from interlock.protocol.speculative import SpeculativeConfig
from interlock.protocol.types import DEFAULT_PREFILL, DEVICE_PATTERN, PREFILL_MODES

RUNNERS = ("auto", "host", "device")
Runner = Literal["host", "device"]


@dataclass(frozen=True)
class EngineConfig:
    """Everything an engine is built with (validated here, never mutated)."""

    speculative: SpeculativeConfig | None = SpeculativeConfig()
    grammar: GrammarConfig = GrammarConfig()
    max_batch_size: int = 8
    num_kv_blocks: int | None = None        # None: enough for max_batch_size full contexts, within kv_cache_bytes
    kv_cache_bytes: int = 1 << 30           # cap on the pool when num_kv_blocks is None (vLLM sizes it by memory too)
    block_size: int = 16
    prefill_chunk: int = 256
    max_step_tokens: int = 512
    output_buffer: int = 16                 # deltas a slow consumer may leave unread before its request pauses
    capture_steps: bool = True              # replay one captured lane program per step shape (else eager)
    max_context: int | None = None          # None: the model's context window
    tp_step_timeout_s: float = 60.0         # tensor parallel: a step taking longer means a hung worker
    # The step watchdog (actors/step/watchdog.py): a step that has not reported back after this long
    # fails the engine with StepOverdueError instead of hanging it (a hung kernel or host function).
    # Generous: a device runner's first step of a shape compiles its kernels. A device fault is
    # noticed sooner, by asking the device every `watchdog_poll_s`.
    step_timeout_s: float = 300.0
    watchdog_poll_s: float = 0.25
    # Keep each host function's name, lane, thread, start and end (`Engine.host_trace()`): what
    # delays a step on a GPU, where one thread runs every lane's host functions. Off: no cost.
    trace_host_functions: bool = False
    # Share the K/V of full prompt blocks between requests (models/prefix_cache.py): a request whose
    # prompt starts with a cached prefix skips prefilling it. Outputs are the same either way.
    # Off under the host runner's tensor parallelism (untested there); on under the device runner's.
    prefix_caching: bool = True
    # torch intra-op threads of the model lane. Each thread that runs torch ops in parallel keeps an
    # OpenMP pool of its own, and two pools on a small machine make each parallel op wait for
    # sleeping workers (decode 2x slower: docs/performance.md). None: min(2, cores) when the
    # thread that starts the engine runs torch at 1 thread (`torch.set_num_threads(1)` before
    # loading, as the CLI does), else 1 (that thread's pool is then the only one).
    threads: int | None = None
    # How prompt chunks are computed on the host runner. "rows": on the int8 rows path every decode
    # step takes, batch invariant, so a prefix-cache hit may end at any block and cover earlier
    # outputs (multi-turn); "dense": GEMMs with the unquantized weights (bf16 where the CPU has bf16
    # dot products, else fp32), a little closer to the checkpoint, hits at whole prefill chunks only.
    # "auto": rows where the kernels run SIMD code, AMX, VNNI or AVX2 (as fast as dense there: models/llama.py),
    # else dense. The device runner's
    # forward is batch invariant for every row: it has one path.
    prefill: str = DEFAULT_PREFILL
    # While the engine runs, keep the objects alive at its start (the model's modules, tokenizer
    # vocabularies, every imported library: ~450k objects after loading SmolLM2) out of the garbage
    # collector's full passes (gc.freeze; gc.unfreeze when it stops). Each full pass otherwise walks
    # them all, ~200 ms holding the GIL. Only the young generations are collected first: older
    # garbage is frozen with the rest until the engine stops. Process-wide: when engines overlap,
    # the first to stop unfreezes for all (each still works, just as before).
    freeze_gc: bool = True
    # Where the target runs: "cpu", "cuda", "cuda:N", or "auto" (CUDA when torch sees a device).
    device: str = "cpu"
    # How a step is computed. "host": the CPU engine (int8 native kernels, shapes as the step
    # needs). "device": fixed-shape steps over persistent buffers (actors/device/verifier.py),
    # decode steps padded to batch buckets and captured (CUDA graphs on CUDA); on the CPU it runs
    # in float32 with torch reference ops, which is how CI tests the CUDA path. "auto": device on
    # CUDA, host on the CPU.
    runner: str = "auto"
    # The device runner's padded batch sizes; None: powers of two below max_batch_size, and it.
    graph_buckets: tuple[int, ...] | None = None
    # law="conditional" (engine/trie.py): the most trie nodes one request's attempts may record
    # (each a few small Python objects, ~200 bytes). A full trie stops learning; attempts stay exact.
    conditional_max_nodes: int = 100_000

    def __post_init__(self) -> None:
        if self.prefill not in PREFILL_MODES:
            raise ValueError(f"prefill must be one of {PREFILL_MODES}, got {self.prefill!r}")
        for name in ("max_batch_size", "output_buffer", "block_size", "kv_cache_bytes", "max_step_tokens",
                     "conditional_max_nodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.threads is not None and (isinstance(self.threads, bool) or not isinstance(self.threads, int)
                                         or self.threads < 1):
            raise ValueError(f"threads must be None or an int >= 1, got {self.threads!r}")
        if not isinstance(self.device, str) or not DEVICE_PATTERN.match(self.device):
            raise ValueError(f"device must be 'cpu', 'cuda', 'cuda:N' or 'auto', got {self.device!r}")
        if not (self.step_timeout_s > 0 and self.watchdog_poll_s > 0):
            raise ValueError(f"step_timeout_s and watchdog_poll_s must be > 0, got {self.step_timeout_s!r}, "
                             f"{self.watchdog_poll_s!r}")
        if self.runner not in RUNNERS:
            raise ValueError(f"runner must be one of {RUNNERS}, got {self.runner!r}")
        buckets = self.graph_buckets
        if buckets is not None and (not buckets or any(not isinstance(b, int) or b < 1 for b in buckets)
                                    or list(buckets) != sorted(set(buckets)) or buckets[-1] > self.max_batch_size):
            raise ValueError(f"graph_buckets must be increasing ints in [1, max_batch_size], got {buckets!r}")

    def torch_device(self) -> torch.device:
        """The device the target runs on. Raises DeviceUnavailableError for CUDA without a device."""
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        device = torch.device(self.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise DeviceUnavailableError(f"device={self.device!r}, but torch sees no CUDA device "
                                         f"(torch {torch.__version__}); use device='cpu' or 'auto'")
        return device

    def runner_for(self, device: torch.device) -> Runner:
        """The runner this config asks for on `device` (see `runner`)."""
        if self.runner == "auto":
            return "device" if device.type == "cuda" else "host"
        if self.runner == "host":
            if device.type != "cpu":
                raise UnsupportedModelError("runner='host' is the CPU engine; on CUDA the runner is 'device'")
            return "host"
        return "device"             # __post_init__ allows only RUNNERS

    def buckets(self) -> tuple[int, ...]:
        """The device runner's padded batch sizes, ending at max_batch_size."""
        if self.graph_buckets is not None:
            return tuple(sorted({*self.graph_buckets, self.max_batch_size}))
        out, b = [], 1
        while b < self.max_batch_size:
            out.append(b)
            b *= 2
        return (*out, self.max_batch_size)
