"""Tool calling and reasoning: wire formats per model family, their parsers (buffered and
streaming, one implementation), and the grammars that make a forced call valid.

Formats (detected from the chat template): hermes (`<tool_call>{json}</tool_call>`, Qwen2.5/3),
llama_json (Llama 3.x: a bare `{"name", "parameters"}` object, maybe after `<|python_tag|>`),
mistral (`[TOOL_CALLS][{...}]`), harmony (gpt-oss channels), gemma (Gemma 3 has no tool tokens; its
documented convention is a Python call in a ```tool_code block, results in ```tool_output), and
generic — for templates with no tool format (SmolLM2's ChatML, TinyLlama's zephyr): tools are
described in the system prompt and the reply is a JSON object `{"tool_calls": [...]}` or
`{"response": "..."}`.
"""
from engine.tools.formats import detect_format, new_call_id, thinks
from engine.tools.parse import Event, OutputParser, ReplyReader, assemble, parse_harmony
from engine.tools.plan import ToolPlan, plan_tools, schema_grammar

__all__ = ["Event", "OutputParser", "ReplyReader", "ToolPlan", "assemble", "detect_format", "new_call_id",
           "parse_harmony", "plan_tools", "schema_grammar", "thinks"]
