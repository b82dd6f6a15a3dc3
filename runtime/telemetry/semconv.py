"""Span attribute names: OpenTelemetry GenAI semantic conventions where one exists, ``llm_dispatch.*``
for the rest. Producer, dispatcher, ingester and history queries all use these constants."""

from __future__ import annotations

# OpenTelemetry GenAI semantic conventions
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_INPUT_MESSAGES = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES = "gen_ai.output.messages"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
ERROR_TYPE = "error.type"

# LLM Dispatch's own namespace
REQUEST_ID = "llm_dispatch.request_id"
PRODUCER_ID = "llm_dispatch.producer_id"
POOL_ID = "llm_dispatch.pool_id"
GROUP_ID = "llm_dispatch.fabric_group"
GATEWAY_ID = "llm_dispatch.gateway_id"
DISPATCHER_ID = "llm_dispatch.dispatcher_id"
BACKEND_URL = "llm_dispatch.backend_url"
MESSAGE_COUNT = "llm_dispatch.message_count"
QUEUE_WAIT_S = "llm_dispatch.queue_wait_s"
EXECUTION_S = "llm_dispatch.execution_s"
TOTAL_S = "llm_dispatch.total_s"
STATUS = "llm_dispatch.status"
ERROR_MESSAGE = "llm_dispatch.error_message"
DROP_REASON = "llm_dispatch.drop_reason"
ATTEMPT = "llm_dispatch.attempt"
COST_UNITS = "llm_dispatch.cost_units"
REPLY_DELIVERED = "llm_dispatch.reply_delivered"
SPAN_KIND_ROLE = "llm_dispatch.role"
TIME_TO_FIRST_TOKEN_S = "llm_dispatch.time_to_first_token_s"
CHUNK_COUNT = "llm_dispatch.chunk_count"
TENANT = "llm_dispatch.tenant"  # who the request is fair to inside its pool (issue 22); absent: untagged
# A request's free-form metadata labels, e.g. llm_dispatch.label.producer (the ingress key's name).
LABEL_PREFIX = "llm_dispatch.label."
PRODUCER_LABEL = f"{LABEL_PREFIX}producer"

SPAN_NAME_SUBMIT = "llm_dispatch.submit"
SPAN_NAME_DISPATCH = "chat"  # a chat call's span name; GenAI convention: "{operation} {model}"
