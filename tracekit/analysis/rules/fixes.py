"""The fixes the rules propose, as code written for the stage they were found on.

Each function returns ``(title, code)``. Names in the code are the stage's own: its stage
name and its function (``code.function``), so the snippet reads as an edit of the user's
code, not a generic recipe.
"""

from __future__ import annotations

import json
import re

from tracekit import semconv
from tracekit.analysis.assembly.blocked_sites import IMPORT_PREFIX, is_import_site
from tracekit.analysis.rules.stage_code import GIL_FREE, StageCode

#: ``json.dumps(payload).encode()`` time over ``orjson.dumps(payload)`` time on an OpenAI-style
#: ``chat.completion`` response of ~2.6 kB. The ``serialize`` fix names it, and its model
#: divides the stage's CPU by it (assuming that CPU is JSON encoding). Measured: see
#: ``docs/analyzer-rules.md`` ("Measured constants") and ``tracekit.analysis.rules.calibration``.
ORJSON_SPEEDUP = 20.0
#: The speed a pure-Python thread keeps (vs. alone) while another thread runs one HF
#: ``tokenizers`` call: ``encode`` holds the GIL, ``encode_batch`` releases it. The ``tokenize``
#: fix's code quotes the ratio. Measured: as above.
TOKENIZERS_GIL = {"encode": 0.06, "encode_batch": 0.7}

_GIL_RATIO = TOKENIZERS_GIL["encode_batch"] / TOKENIZERS_GIL["encode"]


def _literal(text: str) -> str:
    """``text`` as a Python string literal: trace text cannot end the string or the line."""
    return json.dumps(text)


def _ident(function: str | None, fallback: str) -> str:
    """A Python identifier for the function (its last dotted part), else ``fallback``."""
    name = (function or "").rsplit(".", 1)[-1]
    name = re.sub(r"\W", "_", name)
    if not name or name[0].isdigit():
        name = re.sub(r"\W", "_", fallback) or "work"
    return name


def _callers(code: StageCode) -> str:
    # A sync function that becomes a coroutine: its callers must await it now.
    if code.shape == semconv.SHAPE_FUNCTION or code.shape is None:
        return f"\n# callers now await it: `await {_ident(code.qualname, code.stage or 'work')}(...)`"
    return ""


def tokenize_off_loop(code: StageCode, why: str, assumed: bool = False) -> tuple[str, str]:
    """HF tokenizers: ``encode_batch`` in a worker thread (it releases the GIL).

    Code for a sync function or a coroutine (the stage becomes a coroutine that awaits the
    thread); words for a generator or a block, where only the call inside can move.
    ``assumed``: the trace shows no sign of the library (only the stage's kind says
    tokenize): the title says so, and what to do if the stage is Python code instead.
    """
    stage = code.stage or "tokenize"
    where = code.function or stage
    if assumed:
        title, body = tokenize_off_loop(code, "the GIL-free encode_batch")
        what = "run it in a worker thread with the GIL-free encode_batch, as below" if body else (
            "call it as `[encoding] = await asyncio.to_thread(tokenizer.encode_batch, [text])`")
        return (
            f"If {where} calls HF tokenizers' Tokenizer.encode (assumed from the stage's kind, "
            f"{code.kind}: the trace does not show the library; tracekit.integrations.tokenizers "
            f"would record it), {what}. "
            f"If it is Python code, a thread would still hold the GIL: move it to a process "
            f"pool, or make it do less work"
        ), body
    if code.holds_gil is False and code.shape == semconv.SHAPE_FUNCTION:
        # A call recorded as GIL-free (tracekit.integrations.tokenizers: encode_batch,
        # decode_batch): the same call, in a worker thread.
        method = _ident(code.qualname, "encode_batch")
        title = (
            f"Run {where} in a worker thread: it releases the GIL (recorded "
            f"{semconv.HOLDS_GIL}=false, measured per method; {why})"
        )
        body = f"""import asyncio

# at each call site (was: tokenizer.{method}(...) on the event loop):
result = await asyncio.to_thread(tokenizer.{method}, *args)
"""
        return title, body
    if code.is_generator or code.shape == semconv.SHAPE_BLOCK:
        title = (
            f"In {where} ({code.shape_words()}; {why}), call the tokenizer as "
            f"`[encoding] = await asyncio.to_thread(tokenizer.encode_batch, [text])`: "
            f"encode_batch releases the GIL, Tokenizer.encode holds it"
        )
        return title, ""
    fn = _ident(code.qualname, stage)
    title = (
        f"Run {where} in a worker thread with the GIL-free encode_batch "
        f"(Tokenizer.encode holds the GIL; {why})"
    )
    body = f'''import asyncio

@tracekit.stage({_literal(stage)})
async def {fn}(text: str) -> list[int]:
    # was: tokenizer.encode(text) on the event loop, holding the GIL.
    # encode_batch releases the GIL: beside it a pure-Python thread ran
    # {_GIL_RATIO:.0f}x faster than beside encode (measured).
    [encoding] = await asyncio.to_thread(tokenizer.encode_batch, [text])
    return encoding.ids'''
    return title, body + _callers(code) + "\n"


def process_pool(code: StageCode, why: str) -> tuple[str, str]:
    """Python CPU in a module-level sync function: a process pool (a thread would still hold
    the GIL), with the function itself as the pickled callable; or less work."""
    stage = code.stage or "work"
    fn = _ident(code.qualname, stage)
    title = (
        f"Move {code.function or stage}'s CPU to a process pool (a thread would still hold "
        f"the GIL; {why}), or make it do less work"
    )
    body = f"""import asyncio
from concurrent.futures import ProcessPoolExecutor

_pool = ProcessPoolExecutor()  # create once, at startup

def _{fn}(*args):
    ...  # the old body, undecorated, at module level (pickles by name)

@tracekit.stage({_literal(stage)})
async def {fn}(*args):
    loop = asyncio.get_running_loop()
    # the arguments and the result are pickled to the worker and back
    return await loop.run_in_executor(_pool, _{fn}, *args)"""
    return title, body + _callers(code) + "\n"


def thread_pool(code: StageCode, why: str) -> tuple[str, str]:
    """A sync function whose CPU releases the GIL: a worker thread is enough."""
    stage = code.stage or "work"
    fn = _ident(code.qualname, stage)
    title = f"Run {code.function or stage} in a worker thread: its CPU releases the GIL ({why})"
    body = f"""import asyncio

# at each call site (was: {fn}(...) on the event loop):
result = await asyncio.to_thread({fn}, *args)
"""
    return title, body


def move_cpu_in_words(code: StageCode, what: str, why: str) -> tuple[str, str]:
    """Where no code applies as it stands (a coroutine, a method, a closure, a block, an
    unknown shape): what to change, in words, and no code."""
    where = code.function or code.stage or "the request handler's own code"
    if code.stage is None:
        return (
            f"The request handler's own code (outside any stage) ran the CPU ({why}): wrap "
            f"its parts in tracekit.stage to see which, then move that part off the loop "
            f"(a process pool for Python code, or less work)"
        ), ""
    target = (
        "asyncio.to_thread(call, ...)" if what == GIL_FREE
        else "await loop.run_in_executor(process_pool, part, ...)"
    )
    if code.nested:
        move = (
            f"it is {code.shape_words()}, which a process pool cannot pickle: move its "
            f"CPU-bound part to a module-level function of picklable arguments"
        )
    elif code.method:
        move = (
            "a process pool would pickle the instance with the method: move its CPU-bound "
            "part to a module-level function of the data it needs (picklable)"
        )
    elif code.shape in (semconv.SHAPE_COROUTINE, semconv.SHAPE_BLOCK):
        move = (
            f"it is {code.shape_words()}, which a pool cannot run: move the CPU-bound part "
            f"between its awaits into a module-level sync function"
        )
    else:
        move = (
            "its shape is not in the trace (recorded before tracekit.stage.shape): move the "
            "CPU-bound part into a module-level sync function"
        )
    kind = "" if what == GIL_FREE else " (a thread would still hold the GIL)"
    return (
        f"Move {where}'s CPU off the event loop ({why}): {move}, and await it through "
        f"{target}{kind}; or make it do less work"
    ), ""


def less_per_item(code: StageCode, why: str) -> tuple[str, str]:
    """An (async) generator's CPU between the items it yields: no pool can take it."""
    where = code.function or code.stage or "the generator"
    return (
        f"{where} is {code.shape_words()}: its CPU runs on the event loop between the items "
        f"it yields ({why}), and no pool can take it (the generator and its client stay in "
        f"this process). Do less per item: parse with orjson.loads instead of json.loads, "
        f"forward items you do not change without parsing them, yield fewer larger chunks; "
        f"or run more worker processes"
    ), ""


def faster_parser(code: StageCode, why: str) -> tuple[str, str]:
    """JSON decoding: orjson.loads in place of json.loads (a call, whatever the shape)."""
    where = code.function or code.stage or "the handler"
    title = f"Parse JSON with orjson in {where} ({why})"
    body = """import orjson

# was: json.loads(data)
value = orjson.loads(data)  # takes bytes or str; same values as json.loads
"""
    return title, body


def faster_serializer(code: StageCode, why: str) -> tuple[str, str]:
    """JSON encoding: orjson (measured speed-up on a chat.completion payload)."""
    stage = code.stage or "serialize"
    fn = _ident(code.qualname, stage)
    title = (
        f"Serialize with orjson in {code.function or stage} "
        f"({ORJSON_SPEEDUP:.0f}x faster than json.dumps on a chat.completion payload, "
        f"measured; {why})"
    )
    if not code.callable_shape:
        return title, """import orjson

# was: json.dumps(payload).encode()
body = orjson.dumps(payload)  # or msgspec.json.encode(payload)
"""
    body = f'''import orjson

@tracekit.stage({_literal(stage)})
def {fn}(payload: dict) -> bytes:
    # was: json.dumps(payload).encode()
    return orjson.dumps(payload)  # or msgspec.json.encode(payload)
'''
    return title, body


_SLEEP = re.compile(r"\bsleep\b")
_HTTP = re.compile(r"requests|urllib|http\.client|httplib|socket|recv|ssl|connect")
_GPU = re.compile(r"synchronize|cuda|\.item\b|\.cpu\b|\.tolist\b")


def unblock(code: StageCode) -> tuple[str, str]:
    """A blocking call on the loop: its async equivalent, else ``asyncio.to_thread``.

    The call is named by the library frames the watchdog caught (``code.frames``) or the
    location's text; the code fits the stage's shape (a sync function goes to a thread
    whole, at its call sites; inside a coroutine or a generator only the call moves).
    """
    where = code.function or (code.stage if code.stage is not None else "the request handler")
    fn = _ident(code.qualname, code.stage or "handler")
    # One line: a comment that trace text cannot end (a newline in it would add a code line).
    caught = f"  # caught blocking at {' '.join(code.blocked_at.split())}" if code.blocked_at else ""
    text = "\n".join(t for t in (code.blocked_at, code.frames) if t)
    sync = code.shape == semconv.SHAPE_FUNCTION
    whole = f"result = await asyncio.to_thread({fn}, *args)  # at each call site of {fn}"
    if code.blocked_at is not None and is_import_site(code.blocked_at):
        module = code.blocked_at.removeprefix(IMPORT_PREFIX).strip(" ()") or "importlib"
        title = (
            f"{where} blocked the loop importing a module on its first request ({module}): "
            f"import it at start-up (module level or the lifespan hook), so no request pays it"
        )
        return title, ""
    if _SLEEP.search(text):
        title = f"Replace time.sleep in {where} with await asyncio.sleep"
        if sync:
            title = f"{where} is a sync function that sleeps: run it in a worker thread"
            return title, f"{whole}{caught}\n# or make it a coroutine that awaits asyncio.sleep\n"
        return title, f"await asyncio.sleep(delay)  # was: time.sleep(delay){caught}\n"
    if _HTTP.search(text):
        title = f"Use an async HTTP client in {where} instead of a blocking one"
        if code.is_generator:
            return (
                f"{title}: one shared httpx.AsyncClient, and `async with client.stream(...)` "
                f"where {where} ({code.shape_words()}) reads the response"
            ), ""
        return title, f"""import httpx

_client = httpx.AsyncClient(timeout=30.0)  # one per process, reused

async def {fn}(url: str, payload: dict) -> dict:
    # was: requests.post(url, json=payload) on the event loop{caught}
    response = await _client.post(url, json=payload)
    return response.json()""" + _callers(code) + "\n"
    if _GPU.search(text):
        title = f"Wait for the GPU off the event loop in {where}"
        if sync:
            return title, f"{whole}{caught}\n"
        return title, (
            "# was: torch.cuda.synchronize() (or .item()/.cpu()) on the event loop"
            + caught
            + "\nawait asyncio.to_thread(torch.cuda.synchronize)\n"
        )
    title = f"Run the blocking call in {where} in a worker thread (or use its async API)"
    if sync:
        return title, f"# the loop was held with little CPU: a blocking call{caught}\n{whole}\n"
    if code.shape is None:
        return title, (
            f"# the loop was held with little CPU: a blocking call{caught}\n"
            f"result = await asyncio.to_thread({fn}_blocking, *args)  # the old sync body\n"
        )
    return title, (
        f"# inside {fn} ({code.shape_words()}): only the blocking call moves{caught}\n"
        f"result = await asyncio.to_thread(blocking_call, *args)\n"
    )


def speculative_start(
    guard: str, guard_fn: str | None, model: str, model_fn: str | None
) -> tuple[str, str]:
    """An input guardrail before the model: start the model call at once, cancel on reject."""
    g = _ident(guard_fn, guard)
    m = _ident(model_fn, model)
    title = (
        f"Start {model_fn or model} while {guard_fn or guard} runs "
        f"(speculative start, cancel it if the input is rejected)"
    )
    code = f"""import asyncio

async def handle(prompt):
    model_call = asyncio.create_task({m}(prompt))  # start the model call now
    try:
        verdict = await {g}(prompt)
    except BaseException:
        model_call.cancel()
        raise
    if not verdict.allowed:
        model_call.cancel()  # rejected: drop the speculative call
        return refuse(verdict)
    return await model_call  # stream nothing to the client before the verdict
"""
    return title, code


def fan_out(name: str, count: int, function: str | None, language: str | None = None) -> tuple[str, str]:
    """N sequential calls of the same operation: run them concurrently, or batch them (in
    words for a service in another language than Python: its code is not Python)."""
    if language is not None and language.lower() != "python":
        return (
            f"Issue the {count} {name!r} calls concurrently (start them all, then wait for all) "
            f"or as one batched call; the service is written in {language}, so no Python code "
            f"is proposed"
        ), ""
    fn = _ident(function, "fetch") if function else "fetch"
    title = f"Issue the {count} {name!r} calls concurrently (asyncio.gather) or as one batched call"
    code = f"""import asyncio

# the {count} {name!r} calls ran one after another:
# was: for item in items: results.append(await {fn}(item))
results = await asyncio.gather(*({fn}(item) for item in items))
# or, when the backend has one: results = await {fn}_batch(items)
"""
    return title, code


def async_model_client(stage: str, function: str | None) -> tuple[str, str]:
    """Calls serialized in the gateway (a lock, a sync client): an async client, no lock."""
    fn = _ident(function, stage)
    title = (
        f"Let {function or stage} calls overlap: one shared async client, no lock around it "
        f"(and a continuous-batching model server)"
    )
    code = f'''import openai

client = openai.AsyncOpenAI(base_url=MODEL_URL)  # one shared async client

@tracekit.stage({_literal(stage)})
async def {fn}(messages):
    # was: a lock (or a sync client) around the call, so calls ran one at a time
    return await client.chat.completions.create(model=MODEL, messages=messages)
'''
    return title, code


def batching_server(stage: str, function: str | None, running: int = 1) -> tuple[str, str]:
    """The model server answers one request at a time (or, as its own spans said, at most
    ``running`` at once): continuous batching, or more sequences per step."""
    if running > 1:
        title = f"Let {function or stage}'s model server run more sequences at once (--max-num-seqs)"
        code = f"""# The model server ran at most {running} sequences at once and queued the rest.
# Admit more per step (within its KV-cache memory):
vllm serve MODEL --max-num-seqs 256
# TGI: raise --max-concurrent-requests and --max-batch-total-tokens
"""
        return title, code
    title = (
        f"Serve {function or f'the {stage} stage'}'s model with continuous batching "
        f"(vLLM, or a larger --max-num-seqs)"
    )
    code = """# The model server answered one request at a time. Serve the model with a
# continuous-batching server, admitting many sequences per step:
vllm serve MODEL --max-num-seqs 256
# already on vLLM: raise --max-num-seqs; TGI: raise --max-concurrent-requests
"""
    return title, code


def flush_less(stage: str | None, function: str | None) -> tuple[str, str]:
    """Per-chunk work on the loop between tokens: coalesce chunks, serialize faster."""
    where = function or (stage if stage is not None else "the streaming handler")
    title = f"Do less per chunk in {where}: coalesce tokens into fewer chunks, encode with orjson"
    code = """import orjson

async def stream_body(tokens):
    pending = []
    async for token in tokens:
        pending.append(token)
        if len(pending) >= 8:  # flush every 8 tokens instead of every token
            yield b"data: " + orjson.dumps({"tokens": pending}) + b"\\n\\n"
            pending = []
    if pending:
        yield b"data: " + orjson.dumps({"tokens": pending}) + b"\\n\\n"
"""
    return title, code


def busy_loop_streams() -> tuple[str, str]:
    """Stalls from the gateway's loop as a whole (no one stage held it)."""
    title = (
        "The gateway's event loop delays the chunks: take CPU off the loop (the report's loop "
        "section says whose it is) or run more worker processes"
    )
    code = (
        "# each worker process has its own event loop: the streams split between them\n"
        "uvicorn app:app --workers 2\n"
        "# and/or move the loop's largest CPU users (stages, GC, background tasks) off it\n"
    )
    return title, code


def chunked_prefill() -> tuple[str, str]:
    """Stalls not explained by the gateway's loop: the model server's scheduling."""
    title = (
        "Stalls come from the model server, not the gateway's event loop: "
        "enable chunked prefill so long prompts do not pause other streams"
    )
    code = "vllm serve MODEL --enable-chunked-prefill --max-num-batched-tokens 2048\n"
    return title, code
