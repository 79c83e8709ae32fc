"""The one stream loop of the engines fed one request at a time (sglang, vllm, server).

Each of them runs a request elsewhere (an engine core, a scheduler, a server) and gets its
outputs back as a stream on the worker's one engine loop. What happens to those outputs is the
same everywhere and lives here, once: the new ids of each output become a delta, a stop string
that spans a continued sample's seam ends it, the end of a request is assembled into its result
over prefix and new ids alike, a stream the worker closes early is aborted inside the engine,
and an engine's failure is sorted into the record's (RecordError), the engine's (EngineError) or
the engine being out of reach for now (EngineUnavailable) (docs/architecture.md, "Engines" and
"Tokens as they are made"). An engine supplies only how it starts (`launch`, `read_back`), how a
request goes in (`submit`), how one output reads (`unpack`), how its errors read (`sort_error`),
`abort` and `close`.
"""

from __future__ import annotations

import asyncio
import logging
from abc import abstractmethod
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, TypeVar

from fleet.engines.model import ModelEngine
from fleet.errors import EngineError, FleetError, RecordError
from fleet.model.rendering import Prompt, given_prompt, render
from fleet.records import NEUTRAL, GenDelta, GenRequest, Sampling, continued_seed
from fleet.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(slots=True)
class Step:
    """One engine output, unpacked: its new ids and their text; once the request ends, why
    ("stop" | "length") and the facts the record keeps (cached tokens, acceptance, latency)."""

    ids: list[int]
    text: str | None = None
    reason: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)


class StreamEngine(ModelEngine):
    """An engine that runs each request elsewhere and streams its outputs back on the worker's one
    engine loop: built on that loop in `start()`, which every request must then use (SGLang's and
    vLLM's output paths bind to it); what it really runs is read back after start."""

    #: sampling fields this engine counts over output tokens only: a continued request's prefix is
    #: prompt to it, so a sample with any of them set restarts instead (restart_reason)
    output_only: tuple[str, ...] = ()
    #: the engine's own stream ends by itself right after its last output, with nothing more to wait
    #: for: it is run out, not closed there (`run_out`)
    ends_after_last: bool = False

    def __init__(self, settings: Settings, kwargs: dict[str, Any]):
        super().__init__(settings)
        self.kwargs = kwargs
        self._engine: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: set once the engine is found broken: every later request gets it
        self._dead: EngineError | None = None
        #: what the engine really runs, read back after start (None until then)
        self.effective_running: int | None = None
        self.kv_tokens: int | None = None
        #: one thread: the tokenizer is only ever used from it once the engine runs
        self._render = ThreadPoolExecutor(1, thread_name_prefix="fleet-render")

    # -- what each engine supplies ---------------------------------------------------------------

    @property
    @abstractmethod
    def asked_running(self) -> int:
        """S as fleet asks it of the engine, before the engine says what it really runs."""

    @abstractmethod
    async def launch(self) -> Any:
        """Build the engine on this loop (it may block the loop while weights load); returns it."""

    async def read_back(self) -> None:  # noqa: B027 - optional hook
        """Read what the started engine really runs (context, batch, KV tokens)."""

    @abstractmethod
    async def submit(self, request: GenRequest, ids: list[int], sampling: Sampling, max_new: int) -> AsyncIterator[Any]:
        """Send one request (prompt + prefix ids, at most max_new new ids); the engine's own stream of
        its raw outputs, handed over as it is (a layer of ours around it would cost every output)."""

    @abstractmethod
    def unpack(self, request: GenRequest, out: Any) -> Step | None:
        """One raw output as a Step (None: nothing in it); a finish the record cannot keep raises
        RecordError."""

    def sort_error(self, request: GenRequest, error: Exception) -> FleetError:
        """Whose failure an exception out of the engine's stream is: the record's, the engine's
        (the default: an unknown failure is a broken engine) or the engine being out of reach."""
        return EngineError(f"{self.name} engine failed: {type(error).__name__}: {error}")

    def check(self, request: GenRequest, prompt: Prompt, sampling: Sampling) -> None:  # noqa: B027 - optional hook
        """Refuse a request this engine cannot run (RecordError) before it is sent."""

    async def close(self, engine: Any) -> None:  # noqa: B027 - optional hook
        """Shut the engine down; nothing of it may outlive this call."""

    # -- the lifecycle ---------------------------------------------------------------------------

    @property
    def max_running(self) -> int:
        return self.effective_running or self.asked_running

    async def start(self) -> None:
        """Build the engine on this (the worker's) loop, then read back what it runs."""
        self._loop = asyncio.get_running_loop()
        self.load_model_files()
        try:
            self._engine = await self.launch()
        except FleetError:
            raise
        except Exception as e:
            raise EngineError(f"{self.name} engine failed to start: {type(e).__name__}: {e}") from e
        await self.read_back()

    def settle_running(self, running: int | None, advice: str) -> None:
        """S from what the engine reports it runs at once (None: nothing reported; S stays asked),
        never more than fleet asked; a shortfall is logged with what to change."""
        asked = self.asked_running
        if running is None:
            log.warning("%s reports no effective running limit: assuming the %d asked", self.name, asked)
            return
        self.effective_running = min(asked, int(running))
        if self.effective_running < asked:
            log.warning("%s runs %d requests at once, not the %d asked (KV tokens %s): %s", self.name,
                        self.effective_running, asked, self.kv_tokens, advice)
        else:
            log.info("%s runs %d requests at once (KV tokens %s)", self.name, self.effective_running, self.kv_tokens)

    async def shutdown(self) -> None:
        engine, self._engine = self._engine, None
        self._render.shutdown(wait=False, cancel_futures=True)
        if engine is not None:
            await self.close(engine)

    # -- one request -----------------------------------------------------------------------------

    async def render_prompt(self, request: GenRequest) -> Prompt:
        """The request's prompt ids, once the engine is known to be usable: rendered off the loop
        (templating is pure Python and the loop carries the engine's own output path); pre-tokenized
        ids are taken on it, with the engine's own decode (ModelEngine.own_decode)."""
        if self._dead is not None:
            raise self._dead
        if self._engine is None:
            raise EngineError(f"{self.name} engine is not running (not started, or shut down)")
        if asyncio.get_running_loop() is not self._loop:
            raise EngineError(f"{self.name} engine called from a loop other than the one it started on")
        if request.input_ids is not None and self.own_decode is not None:  # nothing to render: no hop
            return given_prompt(request.input_ids, self.own_decode)
        return await asyncio.get_running_loop().run_in_executor(self._render, render, self.tokenizer, request)

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """On the render thread: once the engine runs, only that thread touches the tokenizer."""
        return await asyncio.get_running_loop().run_in_executor(self._render, partial(fn, *args))

    async def prompt_of(self, request: GenRequest) -> Prompt:
        return await self.render_prompt(request)

    def restart_reason(self, request: GenRequest) -> str | None:
        held = [f"{k} {v:g}" for k in self.output_only if (v := getattr(request.sampling, k)) != NEUTRAL[k]]
        if not held:
            return None
        return f"{self.name} counts {', '.join(held)} over output tokens only, and a continued sample's ids are prompt"

    def request_sampling(self, request: GenRequest) -> Sampling:
        """The request's sampling as sent: as the worker resolved it (fleet.records.record_sampling), with a
        continued request's seed derived from (seed, ids made), so its tail draws afresh instead of
        replaying its head's draws."""
        sampling = request.sampling
        return replace(sampling, seed=continued_seed(sampling.seed, len(request.prefix_ids)))

    async def stream(self, request: GenRequest) -> AsyncIterator[GenDelta]:
        prompt = await self.render_prompt(request)
        max_new, filled = await self.room(request, prompt)
        if filled is not None:
            yield GenDelta([], filled)
            return
        sampling = self.request_sampling(request)
        self.check(request, prompt, sampling)
        new: list[int] = []
        texts: list[str] = []
        window = self.seam_window(request)
        try:
            outputs = aiter(await self.submit(request, prompt.ids + request.prefix_ids, sampling, max_new))
        except FleetError:
            raise
        except Exception as e:
            raise self._sorted(request, e) from e
        ended = False
        try:
            while True:
                try:
                    out = await anext(outputs)
                except StopAsyncIteration:
                    break
                except (FleetError, asyncio.CancelledError):
                    raise
                except Exception as e:
                    raise self._sorted(request, e) from e
                step = self.unpack(request, out)
                if step is None:
                    continue
                ids = step.ids
                new += ids
                if step.text:
                    texts.append(step.text)
                if window and len(new) - len(ids) < window and await self.seam_stopped(request, new):
                    yield GenDelta(ids, await self.whole(request, prompt, new, "stop", None, {}))
                    return  # the request runs on inside the engine: aborted below
                if step.reason is None:
                    if ids:
                        yield GenDelta(ids)
                    continue
                ended = True
                text = "".join(texts) if texts else None  # none reported: decoded from the ids
                result = await self.whole(request, prompt, new, step.reason, text, step.facts)
                if self.ends_after_last:
                    await run_out(outputs)
                yield GenDelta(ids, result)
                return
        finally:
            # A stream closed before its end (the worker's repetition stop, a cancelled chunk, a seam
            # stop) ends its request inside the engine, which would otherwise run it to max tokens.
            closer = getattr(outputs, "aclose", None)
            if closer is not None:
                await closer()
            if not ended and self._dead is None and self._engine is not None and request.request_id:
                try:
                    await self.abort(request.request_id)
                except Exception as e:  # the stream's own outcome stands; the engine's next request tells
                    log.warning("%s could not abort request %s: %s: %s", self.name, request.request_id,
                                type(e).__name__, e)
        raise RecordError(f"{self.name} ended record {request.record_id!r} without a finish reason")

    def _sorted(self, request: GenRequest, error: Exception) -> FleetError:
        sorted_error = self.sort_error(request, error)
        if isinstance(sorted_error, EngineError):
            self._dead = sorted_error
        return sorted_error


async def run_out(outputs: AsyncIterator[Any]) -> None:
    """Let an engine's stream end by itself after its last output. Closed there instead, it takes a
    GeneratorExit through the engine's own generators: SGLang runs its failed-request clean-up and
    leaves its inner generators to the loop's finalizer (a cross-thread wake-up and a task each, per
    request), vLLM its abort path. Anything it still yields is not the request's (the close follows)."""
    try:
        await anext(outputs)
    except StopAsyncIteration:
        pass
    except Exception as e:  # noqa: BLE001 - the result is whole; the engine's next request tells of the engine
        log.warning("an engine stream failed after its last output: %s: %s", type(e).__name__, e)
