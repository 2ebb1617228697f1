"""Fixtures for the end-to-end tests: a client of the server that scripts/e2e.sh started."""

import os

import openai
import pytest


@pytest.fixture(scope="session")
def base_url() -> str:
    url = os.environ.get("NUCLEUS_BASE_URL")
    if not url:
        pytest.fail("NUCLEUS_BASE_URL is not set; run the tests through scripts/e2e.sh")
    return url


@pytest.fixture(scope="session")
def model_id() -> str:
    return os.environ.get("NUCLEUS_MODEL_ID", "qwen2.5-coder-0.5b-instruct")


@pytest.fixture(scope="session")
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=300)
