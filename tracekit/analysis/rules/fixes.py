"""The fixes the rules propose, as code written for the stage they were found on.

Each function returns ``(title, code)``. Names in the code are the stage's own: its stage
name and its function (``code.function``), so the snippet reads as an edit of the user's
code, not a generic recipe.
"""

from __future__ import annotations

import json
import re

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


def tokenize_off_loop(stage: str, function: str | None) -> tuple[str, str]:
    """HF tokenizers: ``encode_batch`` in a worker thread (it releases the GIL)."""
    fn = _ident(function, stage)
    title = (
        f"Run {function or stage} in a worker thread with the GIL-free encode_batch "
        f"(Tokenizer.encode holds the GIL)"
    )
    code = f'''import asyncio

@tracekit.stage({_literal(stage)})
async def {fn}(text: str) -> list[int]:
    # was: tokenizer.encode(text) on the event loop, holding the GIL.
    # encode_batch releases the GIL: beside it a pure-Python thread ran
    # {_GIL_RATIO:.0f}x faster than beside encode (measured).
    [encoding] = await asyncio.to_thread(tokenizer.encode_batch, [text])
    return encoding.ids
'''
    return title, code


def process_pool(stage: str | None, function: str | None, route: str) -> tuple[str, str]:
    """Pure-Python CPU: a process pool (threads would still hold the GIL), or less work."""
    where = function or (stage if stage is not None else f"the {route} handler")
    fn = _ident(function, stage or "handler_work")
    stage_line = f'@tracekit.stage({_literal(stage)})\n' if stage is not None else ""
    title = (
        f"Move {where}'s pure-Python CPU to a process pool (a thread would still hold the "
        f"GIL), or make it do less work"
    )
    code = f"""import asyncio
from concurrent.futures import ProcessPoolExecutor

_pool = ProcessPoolExecutor()  # create once, at startup

{stage_line}async def {fn}(*args):
    loop = asyncio.get_running_loop()
    # {fn}_sync is the old body, as a module-level function (it is pickled to the worker)
    return await loop.run_in_executor(_pool, {fn}_sync, *args)
"""
    return title, code


def faster_serializer(stage: str, function: str | None) -> tuple[str, str]:
    """JSON encoding: orjson (measured speed-up on a chat.completion payload)."""
    fn = _ident(function, stage)
    title = (
        f"Serialize with orjson in {function or stage} "
        f"({ORJSON_SPEEDUP:.0f}x faster than json.dumps on a chat.completion payload, measured)"
    )
    code = f'''import orjson

@tracekit.stage({_literal(stage)})
def {fn}(payload: dict) -> bytes:
    # was: json.dumps(payload).encode()
    return orjson.dumps(payload)  # or msgspec.json.encode(payload)
'''
    return title, code


_SLEEP = re.compile(r"\bsleep\b")
_HTTP = re.compile(r"requests|urllib|http\.client|httplib|socket|recv|ssl|connect")
_GPU = re.compile(r"synchronize|cuda|\.item\b|\.cpu\b|\.tolist\b")


def unblock(stage: str | None, function: str | None, blocked_at: str | None) -> tuple[str, str]:
    """A blocking call on the loop: its async equivalent, else ``asyncio.to_thread``."""
    where = function or (stage if stage is not None else "the request handler")
    fn = _ident(function, stage or "handler")
    # One line: a comment that trace text cannot end (a newline in it would add a code line).
    caught = f"  # caught blocking at {' '.join(blocked_at.split())}" if blocked_at else ""
    text = blocked_at or ""
    if _SLEEP.search(text):
        title = f"Replace time.sleep in {where} with await asyncio.sleep"
        code = f"await asyncio.sleep(delay)  # was: time.sleep(delay){caught}\n"
    elif _HTTP.search(text):
        title = f"Use an async HTTP client in {where} instead of a blocking one"
        code = f"""import httpx

_client = httpx.AsyncClient(timeout=30.0)  # one per process, reused

async def {fn}(url: str, payload: dict) -> dict:
    # was: requests.post(url, json=payload) on the event loop{caught}
    response = await _client.post(url, json=payload)
    return response.json()
"""
    elif _GPU.search(text):
        title = f"Wait for the GPU off the event loop in {where}"
        code = (
            "# was: torch.cuda.synchronize() (or .item()/.cpu()) on the event loop"
            + caught
            + "\nawait asyncio.to_thread(torch.cuda.synchronize)\n"
        )
    else:
        title = f"Run the blocking call in {where} in a worker thread (or use its async API)"
        code = (
            f"# the loop was held with little CPU: a blocking call{caught}\n"
            f"result = await asyncio.to_thread({fn}_blocking, *args)  # the old sync body\n"
        )
    return title, code


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


def fan_out(name: str, count: int, function: str | None) -> tuple[str, str]:
    """N sequential calls of the same operation: run them concurrently, or batch them."""
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


def batching_server(stage: str, function: str | None) -> tuple[str, str]:
    """The model server answers one request at a time: continuous batching."""
    title = (
        f"Serve {function or stage}'s model with continuous batching "
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


def chunked_prefill() -> tuple[str, str]:
    """Stalls not explained by the gateway's loop: the model server's scheduling."""
    title = (
        "Stalls come from the model server, not the gateway's event loop: "
        "enable chunked prefill so long prompts do not pause other streams"
    )
    code = "vllm serve MODEL --enable-chunked-prefill --max-num-batched-tokens 2048\n"
    return title, code
