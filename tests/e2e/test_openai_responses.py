"""/v1/responses driven by the official `openai` client (real model, see scripts/e2e.sh)."""

import json

import openai
import pytest

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


def test_create(client, model_id):
    r = client.responses.create(
        model=model_id,
        instructions="Answer with just the number.",
        input="What is 2 + 2?",
        max_output_tokens=16,
        temperature=0,
    )
    assert r.object == "response" and r.status == "completed"
    assert "4" in r.output_text, r
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0


def test_streamed_gives_the_same_text(client, model_id):
    args = dict(model=model_id, input="Name three colours.", max_output_tokens=24, temperature=0)
    whole = client.responses.create(**args)
    kinds, deltas, final = [], [], None
    for event in client.responses.create(stream=True, **args):
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        if event.type in ("response.completed", "response.incomplete"):
            final = event.response
    assert "".join(deltas) == whole.output_text
    assert final.output_text == whole.output_text
    assert kinds[:2] == ["response.created", "response.in_progress"]
    for k in ("response.output_item.added", "response.content_part.added", "response.output_text.done"):
        assert k in kinds
    assert kinds[-1] in ("response.completed", "response.incomplete")


def test_function_tool_round_trip_and_previous_response_id(client, model_id):
    question = "What is the weather in Paris?"
    r = client.responses.create(
        model=model_id,
        input=question,
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=64,
        temperature=0,
    )
    call = [o for o in r.output if o.type == "function_call"][0]
    assert call.name == "get_weather"
    assert isinstance(json.loads(call.arguments)["city"], str)
    # Streamed: the arguments arrive as function_call_arguments deltas.
    args = []
    for event in client.responses.create(
        model=model_id,
        input=question,
        tools=[WEATHER],
        tool_choice="required",
        max_output_tokens=64,
        temperature=0,
        stream=True,
    ):
        if event.type == "response.function_call_arguments.delta":
            args.append(event.delta)
        if event.type == "response.function_call_arguments.done":
            assert event.arguments == "".join(args)
    assert json.loads("".join(args)) == json.loads(call.arguments)
    # The result, with the whole conversation as items (`none`: this small model would
    # otherwise call again).
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "22 C and sunny"}
    answer = client.responses.create(
        model=model_id,
        input=[
            {"role": "user", "content": question},
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            output,
        ],
        tools=[WEATHER],
        tool_choice="none",
        max_output_tokens=48,
        temperature=0,
    )
    assert "22" in answer.output_text or "sunny" in answer.output_text.lower(), answer
    # The same, continuing the stored response.
    again = client.responses.create(
        model=model_id,
        previous_response_id=r.id,
        input=[output],
        tools=[WEATHER],
        tool_choice="none",
        max_output_tokens=48,
        temperature=0,
    )
    assert again.output_text == answer.output_text


def test_json_schema_format(client, model_id):
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
        "required": ["city", "country"],
        "additionalProperties": False,
    }
    r = client.responses.create(
        model=model_id,
        input="Give the capital of France as JSON.",
        text={"format": {"type": "json_schema", "name": "capital", "schema": schema, "strict": True}},
        max_output_tokens=64,
        temperature=0,
    )
    v = json.loads(r.output_text)
    assert set(v) == {"city", "country"}


def test_unsupported_fields_are_named(client, model_id):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=model_id, input="hi", extra_body={"top_k_sampling": 3})
    assert "top_k_sampling" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=model_id, input="hi", reasoning={"effort": "high"})
    assert "reasoning" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=model_id, input="hi", previous_response_id="resp_unknown")
    assert "previous_response_id" in str(e.value)
