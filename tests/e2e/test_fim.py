"""Fill-in-the-middle with the official `openai` client (`completions.create(..., suffix=...)`)
and llama-server's `/infill`, as editor plugins call it (see scripts/e2e.sh)."""

import json
import urllib.request

PREFIX = "def add(a, b):\n    "
SUFFIX = "\n\nprint(add(1, 2))\n"


def test_completion_with_suffix_fills_the_middle(client, model_id):
    r = client.completions.create(
        model=model_id, prompt=PREFIX, suffix=SUFFIX, max_tokens=32, temperature=0
    )
    c = r.choices[0]
    # The middle (the 0.5B instruct model does not always stop where the suffix begins).
    assert c.text.startswith("return a + b"), c.text
    assert c.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 0


def test_completion_with_suffix_streams(client, model_id):
    chunks = list(
        client.completions.create(
            model=model_id, prompt=PREFIX, suffix=SUFFIX, max_tokens=32, temperature=0, stream=True
        )
    )
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    whole = client.completions.create(
        model=model_id, prompt=PREFIX, suffix=SUFFIX, max_tokens=32, temperature=0
    )
    assert text == whole.choices[0].text


def test_infill_second_request_in_the_same_file_is_cached(base_url):
    body = {
        "input_prefix": PREFIX,
        "input_suffix": SUFFIX,
        "input_extra": [{"filename": "shapes.py", "text": "def square(x):\n    return x * x\n"}],
        "n_predict": 32,
        "temperature": 0,
    }

    def infill(b):
        req = urllib.request.Request(
            base_url + "/infill",
            data=json.dumps(b).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=300) as r:
            return json.loads(r.read())

    first = infill(body)
    assert "return" in first["content"], first
    assert first["stop"] is True and first["stop_type"] in ("eos", "limit")
    assert first["prompt"].startswith("<|repo_name|>myproject\n<|file_sep|>shapes.py\n")
    second = infill(dict(body, input_suffix=SUFFIX + "# done\n"))
    assert second["tokens_cached"] > 0
    assert second["timings"]["cache_n"] == second["tokens_cached"]
