"""/v1/messages driven by the official `anthropic` client (real model, see scripts/e2e.sh)."""

import anthropic
import pytest

WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


@pytest.fixture(scope="session")
def claude(base_url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0, timeout=300)


def test_messages_create(claude, model_id):
    m = claude.messages.create(
        model=model_id,
        max_tokens=16,
        extra_body={"temperature": 0},  # the newest client has no `temperature` argument
        system="Answer with just the number.",
        messages=[{"role": "user", "content": "What is 2 + 2?"}],
    )
    assert m.type == "message" and m.role == "assistant"
    assert m.content[0].type == "text"
    assert "4" in m.content[0].text, m
    assert m.stop_reason == "end_turn"
    assert m.usage.input_tokens > 0 and m.usage.output_tokens > 0


def test_messages_stream_gives_the_same_text_and_event_order(claude, model_id):
    args = dict(
        model=model_id,
        max_tokens=24,
        extra_body={"temperature": 0},  # the newest client has no `temperature` argument
        messages=[
            {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": [{"type": "text", "text": "Name three more."}]},
        ],
    )
    whole = claude.messages.create(**args)
    kinds = []
    with claude.messages.stream(**args) as stream:
        for event in stream:
            kinds.append(event.type)
        final = stream.get_final_message()
    assert final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert kinds[0] == "message_start"
    assert "content_block_start" in kinds and "content_block_stop" in kinds
    assert kinds[-2:] == ["message_delta", "message_stop"]


def test_stop_sequences_and_max_tokens(claude, model_id):
    m = claude.messages.create(
        model=model_id,
        max_tokens=64,
        extra_body={"temperature": 0},  # the newest client has no `temperature` argument
        stop_sequences=["3"],
        messages=[{"role": "user", "content": "Count from 1 to 5, separated by commas."}],
    )
    assert m.stop_reason == "stop_sequence", m
    assert m.stop_sequence == "3"
    assert "3" not in m.content[0].text
    m = claude.messages.create(
        model=model_id, max_tokens=3, messages=[{"role": "user", "content": "Tell a story."}]
    )
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3


def test_tool_round_trip(claude, model_id):
    question = {"role": "user", "content": "What is the weather in Paris?"}
    m = claude.messages.create(
        model=model_id,
        max_tokens=64,
        extra_body={"temperature": 0},  # the newest client has no `temperature` argument
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[question],
    )
    assert m.stop_reason == "tool_use", m
    use = [b for b in m.content if b.type == "tool_use"][0]
    assert use.name == "get_weather" and isinstance(use.input["city"], str)
    # Streamed, the call arrives as input_json_delta pieces.
    with claude.messages.stream(
        model=model_id,
        max_tokens=64,
        extra_body={"temperature": 0},  # the newest client has no `temperature` argument
        tools=[WEATHER],
        tool_choice={"type": "any"},
        messages=[question],
    ) as stream:
        streamed = stream.get_final_message()
    s_use = [b for b in streamed.content if b.type == "tool_use"][0]
    assert s_use.input == use.input
    # The answer to the result (`none`: this small model would otherwise call again).
    answer = claude.messages.create(
        model=model_id,
        max_tokens=48,
        extra_body={"temperature": 0},  # the newest client has no `temperature` argument
        tools=[WEATHER],
        tool_choice={"type": "none"},
        messages=[
            question,
            {"role": "assistant", "content": m.content},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": use.id, "content": "22 C and sunny"}
                ],
            },
        ],
    )
    text = "".join(b.text for b in answer.content if b.type == "text")
    assert "22" in text or "sunny" in text.lower(), answer


def test_count_tokens(claude, model_id):
    args = dict(model=model_id, messages=[{"role": "user", "content": "Hello there"}])
    n = claude.messages.count_tokens(**args).input_tokens
    m = claude.messages.create(max_tokens=1, **args)
    assert n == m.usage.input_tokens > 0
    more = claude.messages.count_tokens(tools=[WEATHER], **args).input_tokens
    assert more > n


def test_errors_have_anthropics_shape(claude, model_id):
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(
            model=model_id,
            max_tokens=8,
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"top_a": 0.5},
        )
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert "top_a" in e.value.body["error"]["message"]
    # The catalog model has no reasoning mode.
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(
            model=model_id,
            max_tokens=8,
            thinking={"type": "enabled", "budget_tokens": 1024},
            messages=[{"role": "user", "content": "hi"}],
        )
    assert "thinking" in e.value.body["error"]["message"]
