"""Every span attribute name and stage kind tracekit writes or reads (DESIGN §2).

Like OpenTelemetry's ``semconv`` packages: names live here and nowhere else, so a rename is
one edit and a typo is an ``AttributeError``, not a silently missing attribute. The full
meaning, unit and method of each attribute is in ``docs/attributes.md``. All durations are
milliseconds as floats.
"""

from __future__ import annotations

from typing import Final

# --- stage kinds --------------------------------------------------------------------------
KIND_TOKENIZE: Final = "tokenize"
KIND_GUARDRAIL: Final = "guardrail"
KIND_MODEL: Final = "model"
KIND_SERIALIZE: Final = "serialize"
KIND_OTHER: Final = "other"
STAGE_KINDS: Final[tuple[str, ...]] = (KIND_TOKENIZE, KIND_GUARDRAIL, KIND_MODEL, KIND_SERIALIZE, KIND_OTHER)

# --- stage span (INTERNAL) ----------------------------------------------------------------
STAGE: Final = "tracekit.stage"
STAGE_KIND: Final = "tracekit.stage.kind"
# What the stage wraps, so a fix can fit it: one of STAGE_SHAPES.
STAGE_SHAPE: Final = "tracekit.stage.shape"
SHAPE_FUNCTION: Final = "function"  # a sync function (or method)
SHAPE_COROUTINE: Final = "coroutine"  # an async function (or method)
SHAPE_ASYNC_GENERATOR: Final = "async_generator"
SHAPE_GENERATOR: Final = "generator"
SHAPE_BLOCK: Final = "block"  # a with / async with block
STAGE_SHAPES: Final[tuple[str, ...]] = (SHAPE_FUNCTION, SHAPE_COROUTINE, SHAPE_ASYNC_GENERATOR,
                                        SHAPE_GENERATOR, SHAPE_BLOCK)  # fmt: skip
WALL_MS: Final = "tracekit.wall_ms"
CPU_MS: Final = "tracekit.cpu_ms"
# The part of cpu_ms run off the event-loop thread: a sync stage in a worker thread, or work
# handed to thread and process pools (tracekit._core.handoff). Written when not zero.
CPU_OFF_LOOP_MS: Final = "tracekit.cpu_off_loop_ms"
WAIT_MS: Final = "tracekit.wait_ms"
LOOP_WAIT_MS: Final = "tracekit.loop_wait_ms"
MAX_BLOCK_MS: Final = "tracekit.max_block_ms"
ON_LOOP: Final = "tracekit.on_loop"
BLOCKED_AT: Final = "tracekit.blocked_at"
# Time covered by child stages (wall = cpu + wait + loop_wait + children + consumer).
CHILDREN_MS: Final = "tracekit.children_ms"
# Async-generator stages: time the consumer held each yielded item (outside the stage's code).
CONSUMER_MS: Final = "tracekit.consumer_ms"
# Garbage collection inside the stage's own steps (never counted as its CPU).
GC_MS: Final = "tracekit.gc_ms"
# Suspended on a lock, semaphore, condition or queue: waiting for other tasks of the process.
QUEUE_WAIT_MS: Final = "tracekit.queue_wait_ms"
# Request spans: CPU the request's own code, the tasks it spawned and the stages they ran used
# after its response was complete (background tasks, spend logging): not in its cpu_ms.
AFTER_RESPONSE_CPU_MS: Final = "tracekit.after_response_cpu_ms"
# Request spans: from the server making the request's task (having read its headers) to the
# middleware's first step: a lower bound of the wait before the span began.
START_WAIT_MS: Final = "tracekit.start_wait_ms"
# The part of it that ran off the event-loop thread (a sync background task in a thread pool).
AFTER_RESPONSE_CPU_OFF_LOOP_MS: Final = "tracekit.after_response_cpu_off_loop_ms"
# A request whose server span another instrumentation owns (FastAPI's telemetry): that span
# ended with the response, so these two go on a child span of this name, from the response's
# end to the last work after it.
AFTER_RESPONSE_SPAN: Final = "tracekit.after_response"
# Number of resumptions (steps) of the stage's code.
STEPS: Final = "tracekit.steps"
# The stage's own slices on the event loop that lasted >= 1 ms, as a flat int array
# [start_offset_us, duration_us, ...] relative to the span's start (at most 32 pairs, longest kept).
LOOP_SLICES_US: Final = "tracekit.loop_slices_us"
# Its estimated waits for the loop >= 1 ms, same encoding: ready -> resumed.
LOOP_WAITS_US: Final = "tracekit.loop_waits_us"
TOKENS: Final = "tracekit.tokens"
# Whether the stage's call holds the GIL throughout (a library call whose behaviour was
# measured, e.g. tokenizers' encode: true, encode_batch: false); absent when not known.
HOLDS_GIL: Final = "tracekit.holds_gil"
CODE_FUNCTION: Final = "code.function"
CODE_NAMESPACE: Final = "code.namespace"

# Span event the watchdog adds when it caught a slice holding the loop.
EVENT_BLOCKED: Final = "tracekit.blocked"
EVENT_STACK: Final = "tracekit.stack"  # attribute of EVENT_BLOCKED: innermost frames, one per line
EVENT_BLOCKED_MS: Final = "tracekit.blocked_ms"  # attribute: how long the slice had held the loop

# Where a sampled stage call (or a busy loop window) spent its time, from pyinstrument
# (tracekit.integrations.pyinstrument; docs/attributes.md, "Profiles"). On a stage span or
# a tracekit.loop window span.
# The hottest functions, one a line: "fn (file:line) self X ms, total Y ms".
PROFILE_HOT: Final = "tracekit.profile.hot"
PROFILE_TREE: Final = "tracekit.profile.tree"  # the call tree, one frame a line, indented by depth
PROFILE_MS: Final = "tracekit.profile.ms"  # sampled time in the code, awaits excluded
PROFILE_SAMPLES: Final = "tracekit.profile.samples"
PROFILE_REASON: Final = "tracekit.profile.reason"  # loop windows: why it was profiled

# An in-process torch model (tracekit.integrations.torch; docs/attributes.md, "torch"), on
# the stage span that ran it: summed over its forward calls in the stage.
TORCH_MODULE: Final = "tracekit.torch.module"  # the module's class name
TORCH_DEVICE: Final = "tracekit.torch.device"  # its parameters' device: "cuda:0", "cpu"
TORCH_DTYPE: Final = "tracekit.torch.dtype"  # its floating-point parameters' dtype: "float32"
TORCH_PARAM_BYTES: Final = "tracekit.torch.param_bytes"  # bytes of its parameters and buffers
TORCH_CALLS: Final = "tracekit.torch.calls"  # forward calls
TORCH_DEVICE_MS: Final = "tracekit.torch.device_ms"  # GPU time between CUDA events around forward
TORCH_LAUNCH_MS: Final = "tracekit.torch.launch_ms"  # host CPU time inside forward (launching kernels)
TORCH_SYNC_MS: Final = "tracekit.torch.sync_ms"  # wall time blocked waiting for the device

# --- request span (SERVER) ----------------------------------------------------------------
MODEL_WAIT_MS: Final = "tracekit.model_wait_ms"
IO_WAIT_MS: Final = "tracekit.io_wait_ms"
OVERHEAD_MS: Final = "tracekit.overhead_ms"
TTFB_MS: Final = "tracekit.ttfb_ms"
TTFT_MS: Final = "tracekit.ttft_ms"
ITL_P50_MS: Final = "tracekit.itl_p50_ms"
ITL_P95_MS: Final = "tracekit.itl_p95_ms"
ITL_MAX_MS: Final = "tracekit.itl_max_ms"
TPOT_MS: Final = "tracekit.tpot_ms"
CHUNKS: Final = "tracekit.chunks"
CANCELLED: Final = "tracekit.cancelled"  # the client went away, or the request was cancelled
INFLIGHT: Final = "tracekit.inflight"
# The request span's own tracekit attributes reuse WALL_MS, CPU_MS, LOOP_WAIT_MS,
# MAX_BLOCK_MS, ON_LOOP and BLOCKED_AT with request-wide meaning (sums; max over the request).

# --- loop window span ("tracekit.loop"): what one event loop ran in a window (docs/attributes.md) --
LOOP_SPAN: Final = "tracekit.loop"
LOOP_THREAD: Final = "tracekit.loop.thread"  # the loop thread's name
LOOP_PID: Final = "tracekit.loop.pid"  # the process the loop runs in (worker processes)
LOOP_BUSY_RATIO: Final = "tracekit.loop.busy_ratio"  # loop thread CPU / window wall time
LOOP_CPU_MS: Final = "tracekit.loop.cpu_ms"  # loop thread CPU (kernel per-thread clock)
LOOP_REQUESTS_CPU_MS: Final = "tracekit.loop.requests_cpu_ms"  # traced requests and tasks they spawned
LOOP_GC_CPU_MS: Final = "tracekit.loop.gc_cpu_ms"  # garbage collection on the loop thread
LOOP_TRACEKIT_CPU_MS: Final = "tracekit.loop.tracekit_cpu_ms"  # tracekit's bookkeeping between steps
LOOP_BACKGROUND_CPU_MS: Final = "tracekit.loop.background_cpu_ms"  # the rest: server, tasks of no request
# The tasks of no request that took the most of it, by coroutine (module.qualname), and their
# CPU in ms (parallel arrays; tracekit._core.spawned times each of their steps).
LOOP_BACKGROUND_TASKS: Final = "tracekit.loop.background_tasks"
LOOP_BACKGROUND_TASKS_CPU_MS: Final = "tracekit.loop.background_tasks_cpu_ms"
LOOP_GC_MS: Final = "tracekit.loop.gc_ms"  # wall time of the collections
LOOP_GC_COUNTS: Final = "tracekit.loop.gc_counts"  # collections per generation [0, 1, 2]
LOOP_GC_MAX_MS: Final = "tracekit.loop.gc_max_ms"  # the longest collection (most CPU): its wall
LOOP_GC_MAX_CPU_MS: Final = "tracekit.loop.gc_max_cpu_ms"  # ... and its CPU
# Time the loop thread was ready to run but waited for a CPU (Linux run-queue delay)
LOOP_RUNQUEUE_MS: Final = "tracekit.loop.runqueue_ms"
LOOP_GC_MAX_GENERATION: Final = "tracekit.loop.gc_max_generation"  # its generation
LOOP_LAG_P50_MS: Final = "tracekit.loop.lag_p50_ms"  # the loop probe: work made ready waits this long
LOOP_LAG_P95_MS: Final = "tracekit.loop.lag_p95_ms"
LOOP_LAG_MAX_MS: Final = "tracekit.loop.lag_max_ms"
LOOP_PROBES: Final = "tracekit.loop.probes"  # probe measurements in the window
LOOP_INFLIGHT: Final = "tracekit.loop.inflight"  # traced requests in flight at the window's end
LOOP_TASKS: Final = "tracekit.loop.tasks"  # tasks alive on the loop (counted once in the window)

# --- OpenTelemetry HTTP server semantic conventions (stable) -------------------------------
HTTP_REQUEST_METHOD: Final = "http.request.method"
HTTP_ROUTE: Final = "http.route"
HTTP_RESPONSE_STATUS_CODE: Final = "http.response.status_code"
URL_PATH: Final = "url.path"
URL_QUERY: Final = "url.query"
URL_SCHEME: Final = "url.scheme"
URL_FULL: Final = "url.full"  # an HTTP client span's URL
SERVER_ADDRESS: Final = "server.address"
SERVER_PORT: Final = "server.port"
CLIENT_ADDRESS: Final = "client.address"
CLIENT_PORT: Final = "client.port"
NETWORK_PROTOCOL_VERSION: Final = "network.protocol.version"
USER_AGENT_ORIGINAL: Final = "user_agent.original"
ERROR_TYPE: Final = "error.type"
# Old (pre-1.21) names, read by the analyzer from traces made by older instrumentation.
HTTP_METHOD_OLD: Final = "http.method"
HTTP_STATUS_CODE_OLD: Final = "http.status_code"
HTTP_TARGET_OLD: Final = "http.target"
HTTP_URL_OLD: Final = "http.url"

# --- OpenTelemetry GenAI semantic conventions ----------------------------------------------
# Followed version: semantic conventions v1.37.0 (GenAI is "Development" status there).
GENAI_SEMCONV_VERSION: Final = "1.37.0"
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_STREAM: Final = "gen_ai.request.stream"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK: Final = "gen_ai.response.time_to_first_chunk"  # seconds
# Values of gen_ai.operation.name and gen_ai.provider.name the httpx integration writes.
GEN_AI_OPERATION_CHAT: Final = "chat"
GEN_AI_OPERATION_TEXT_COMPLETION: Final = "text_completion"
GEN_AI_OPERATION_EMBEDDINGS: Final = "embeddings"
GEN_AI_PROVIDER_OPENAI: Final = "openai"
GEN_AI_PROVIDER_AZURE_OPENAI: Final = "azure.ai.openai"
GEN_AI_PROVIDER_ANTHROPIC: Final = "anthropic"

# --- a model call's stream as it arrived (the httpx integration, on the model stage) --------
# The model server's own pace, as the gateway read it, beside the gateway's reply's pace
# (TTFT_MS, ITL_*, TPOT_MS, CHUNKS on the request span): same definitions, over the
# streamed events (SSE) of the model's reply, from the model call's start.
UPSTREAM_TTFT_MS: Final = "tracekit.upstream.ttft_ms"
UPSTREAM_ITL_P50_MS: Final = "tracekit.upstream.itl_p50_ms"
UPSTREAM_ITL_P95_MS: Final = "tracekit.upstream.itl_p95_ms"
UPSTREAM_ITL_MAX_MS: Final = "tracekit.upstream.itl_max_ms"
UPSTREAM_TPOT_MS: Final = "tracekit.upstream.tpot_ms"
UPSTREAM_CHUNKS: Final = "tracekit.upstream.chunks"
# True when gen_ai.usage.output_tokens is the count of streamed chunks, not the server's figure
# (a stream without usage: no stream_options.include_usage).
UPSTREAM_TOKENS_COUNTED: Final = "tracekit.upstream.tokens_counted"

# --- OpenInference (Arize Phoenix and other LLM observability tools) --------------------------
# Followed version: OpenInference semantic conventions spec (openinference-semantic-conventions
# 0.1.x). Every tracekit span carries the span kind: the request span is a CHAIN, a model stage
# an LLM call, a guardrail stage a GUARDRAIL, the other stages CHAIN (application steps).
OPENINFERENCE_SPAN_KIND: Final = "openinference.span.kind"
OPENINFERENCE_LLM: Final = "LLM"
OPENINFERENCE_CHAIN: Final = "CHAIN"
OPENINFERENCE_GUARDRAIL: Final = "GUARDRAIL"
OPENINFERENCE_KIND_BY_STAGE: Final[dict[str, str]] = {
    KIND_MODEL: OPENINFERENCE_LLM, KIND_GUARDRAIL: OPENINFERENCE_GUARDRAIL}  # fmt: skip
# A model stage's gen_ai.* values, repeated under the OpenInference names Phoenix displays.
LLM_MODEL_NAME: Final = "llm.model_name"
LLM_PROVIDER: Final = "llm.provider"
LLM_SYSTEM: Final = "llm.system"
LLM_TOKEN_COUNT_PROMPT: Final = "llm.token_count.prompt"
LLM_TOKEN_COUNT_COMPLETION: Final = "llm.token_count.completion"
LLM_TOKEN_COUNT_TOTAL: Final = "llm.token_count.total"

# --- vLLM's own request spans (joined through traceparent) --------------------------------
# vLLM's names (vllm/tracing.py SpanAttributes, not OpenTelemetry conventions): its SERVER
# span per request, and its attributes; latencies in seconds, as vLLM writes them.
VLLM_REQUEST_SPAN: Final = "llm_request"
VLLM_REQUEST_ID: Final = "gen_ai.request.id"
VLLM_USAGE_PROMPT_TOKENS: Final = "gen_ai.usage.prompt_tokens"
VLLM_USAGE_COMPLETION_TOKENS: Final = "gen_ai.usage.completion_tokens"
VLLM_LATENCY_TIME_IN_QUEUE: Final = "gen_ai.latency.time_in_queue"  # seconds
VLLM_LATENCY_TIME_TO_FIRST_TOKEN: Final = "gen_ai.latency.time_to_first_token"  # seconds
VLLM_LATENCY_E2E: Final = "gen_ai.latency.e2e"  # seconds
VLLM_LATENCY_TIME_IN_MODEL_PREFILL: Final = "gen_ai.latency.time_in_model_prefill"  # seconds
VLLM_LATENCY_TIME_IN_MODEL_DECODE: Final = "gen_ai.latency.time_in_model_decode"  # seconds
VLLM_LATENCY_TIME_IN_MODEL_INFERENCE: Final = "gen_ai.latency.time_in_model_inference"  # seconds

# --- span names of other instrumentation, read by the analyzer (docs/composition.md) -------
# FastAPI's native telemetry (0.165+): its operation spans under the server span. The
# analyzer counts its response serialization as a stage of kind serialize.
FASTAPI_SERIALIZATION: Final = "fastapi.serialization"
FASTAPI_SPAN_PREFIX: Final = "fastapi."  # its operation spans: never a request of their own

# --- resource / scope ----------------------------------------------------------------------
SERVICE_NAME: Final = "service.name"
# The language of the instrumented process: fix code is Python's, other services get words.
TELEMETRY_SDK_LANGUAGE: Final = "telemetry.sdk.language"
# Resource attributes tracekit adds (no OpenTelemetry convention names a CPU count; the
# metric system.cpu.logical.count is not a resource attribute): the gateway host's logical
# CPUs, and the CPUs the process may run on (its affinity; a container's CPU quota is not
# seen). The replay's cores (docs/analyzer-rules.md, "The projection model").
HOST_CPUS: Final = "tracekit.host.cpus"
PROCESS_CPUS: Final = "tracekit.process.cpus"
SCOPE_NAME: Final = "tracekit"
