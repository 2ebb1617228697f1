"""Writes the JSON schemas that the openai SDK, langchain and instructor send for one Pydantic
model (City), as they put them in the request body. Run in a venv with openai,
langchain-openai, instructor and pydantic installed:

    python capture.py   # writes openai.json, langchain.json, instructor.json here
"""
import json
import os

from pydantic import BaseModel, Field


class City(BaseModel):
    """A city and where it is."""

    name: str = Field(description="The city's name")
    country: str
    population: int


here = os.path.dirname(os.path.abspath(__file__))


def write(name, schema):
    with open(os.path.join(here, name), "w") as f:
        json.dump(schema, f, indent=2)
        f.write("\n")


# openai: client.chat.completions.parse(response_format=City) sends this response_format.
from openai.lib._parsing._completions import type_to_response_format_param

write("openai.json", type_to_response_format_param(City)["json_schema"]["schema"])

# langchain: ChatOpenAI(...).with_structured_output(City) and its tool-calling method build the
# schema with convert_to_openai_function (no `additionalProperties`).
from langchain_core.utils.function_calling import convert_to_openai_function

write("langchain.json", convert_to_openai_function(City)["parameters"])

# instructor: instructor.from_openai(client) (mode TOOLS) sends the model as a tool's parameters.
from instructor import openai_schema

write("instructor.json", openai_schema(City).openai_schema["parameters"])
