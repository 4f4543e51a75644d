"""Renders the chat templates in tests/data/templates/ with Python's jinja2 exactly as transformers
does (its own compiled environment: ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
loopcontrols, its tojson / raise_exception / strftime_now) and writes the expected outputs that the
C++ test (tests/unit/jinja/templates_test.cpp) compares byte for byte.

Writes:
  tests/data/templates/manifest.json       templates (with their bos/eos tokens) and message cases
  tests/data/templates/expected/<template>__<case>.txt    rendered prompt, or
  tests/data/templates/expected/<template>__<case>.error  the jinja2 error (the C++ side must fail too)
  tests/data/templates/expected/constructs.json  per-construct snippets (tests/jinja/constructs.txt)

Run: python tests/jinja/make_expected.py   (with the pinned jinja2 and transformers)
"""
import json
import os
import pathlib

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
import jinja2  # noqa: E402
import transformers  # noqa: E402
from transformers.utils.chat_template_utils import _compile_jinja_template, render_jinja_template  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "tests/data/templates"

TEMPLATES = {
    "chatml": {"bos_token": "<s>", "eos_token": "<|im_end|>"},
    "deepseek-coder-instruct": {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<|EOT|>"},
    "deepseek-v2": {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
    "deepseek-v3": {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
    "gemma": {"bos_token": "<bos>", "eos_token": "<eos>"},
    "llama-2-chat": {"bos_token": "<s>", "eos_token": "</s>"},
    "llama-3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "llama-3.1": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "mistral-7b-instruct-v0.1": {"bos_token": "<s>", "eos_token": "</s>"},
    "mistral-7b-instruct-v0.3": {"bos_token": "<s>", "eos_token": "</s>"},
    "phi-3": {"bos_token": "<s>", "eos_token": "<|endoftext|>"},
    "qwen2.5": {"bos_token": "", "eos_token": "<|im_end|>"},
    "qwen3": {"bos_token": "", "eos_token": "<|im_end|>"},
    "smollm2": {"bos_token": "", "eos_token": "<|im_end|>"},
    "smolvlm": {"bos_token": "<|im_start|>", "eos_token": "<end_of_utterance>"},
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city. Returns \"sunny\" or \"rainy\".",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7.5},
            },
            "required": ["city"],
        },
    },
}
TIME_TOOL = {"type": "function", "function": {"name": "get_time", "description": "Current time.",
                                               "parameters": {"type": "object", "properties": {}}}}

SYS = {"role": "system", "content": "You are a helpful assistant."}
U1 = {"role": "user", "content": "Hello! How are you?"}
A1 = {"role": "assistant", "content": "I'm fine, thanks. How can I help?"}
U2 = {"role": "user", "content": "What is 2 + 2?"}

CASES = [
    {"name": "single_user", "messages": [U1], "add_generation_prompt": True},
    {"name": "single_user_no_prompt", "messages": [U1], "add_generation_prompt": False},
    {"name": "system_user", "messages": [SYS, U1], "add_generation_prompt": True},
    {"name": "multi_turn", "messages": [SYS, U1, A1, U2], "add_generation_prompt": True},
    {"name": "multi_turn_no_system", "messages": [U1, A1, U2], "add_generation_prompt": False},
    {"name": "ends_with_assistant", "messages": [U1, A1], "add_generation_prompt": False},
    {"name": "unicode", "add_generation_prompt": True, "messages": [
        {"role": "user", "content": "héllo wörld — 你好，世界 😀 \"quotes\" 'single' \\ back\ttab"},
        {"role": "assistant", "content": "Ça va? “curly” ‘x’ ß ǅ İ"},
        {"role": "user", "content": "Ελληνικά ΣΊΣΥΦΟΣ"}]},
    {"name": "empty_content", "add_generation_prompt": True, "messages": [
        {"role": "user", "content": ""}, {"role": "assistant", "content": ""}, {"role": "user", "content": ""}]},
    {"name": "whitespace", "add_generation_prompt": False, "messages": [
        {"role": "system", "content": "  system with spaces \n"},
        {"role": "user", "content": "\n\n  padded question  \n"},
        {"role": "assistant", "content": " \t answer\n\n"}]},
    {"name": "bad_alternation", "add_generation_prompt": True, "messages": [U1, U2]},
    {"name": "tool_call", "add_generation_prompt": True, "tools": [WEATHER_TOOL], "messages": [
        SYS,
        {"role": "user", "content": "What's the weather in Zürich?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call12345", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius", "days": 2}}}]},
        {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": "{\"temp\": 21.5, \"sky\": \"sunny\"}"},
        {"role": "assistant", "content": "It is sunny and 21.5 °C."},
        {"role": "user", "content": "Thanks!"}]},
    {"name": "tools_no_system", "add_generation_prompt": True, "tools": [WEATHER_TOOL, TIME_TOOL],
     "messages": [{"role": "user", "content": "Time and weather in Paris?"}]},
    {"name": "parallel_tool_calls", "add_generation_prompt": True, "tools": [WEATHER_TOOL, TIME_TOOL], "messages": [
        {"role": "user", "content": "Weather and time?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "abcdefghi", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
            {"id": "jklmnopqr", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "abcdefghi", "content": "rainy"},
        {"role": "tool", "tool_call_id": "jklmnopqr", "content": "12:00"}]},
    {"name": "string_arguments", "add_generation_prompt": False, "tools": [WEATHER_TOOL], "messages": [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"id": "call00001", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "call00001", "content": "snow"},
        {"role": "assistant", "content": "It snows in Oslo."}]},
    {"name": "reasoning", "add_generation_prompt": True, "messages": [
        U1, {"role": "assistant", "content": "<think>\nThe user greets me.\n</think>\n\nHi there!"}, U2]},
    {"name": "thinking_disabled", "add_generation_prompt": True, "kwargs": {"enable_thinking": False}, "messages": [U2]},
    {"name": "date_string", "add_generation_prompt": True, "kwargs": {"date_string": "01 Jan 2025"}, "messages": [SYS, U2]},
    {"name": "content_parts", "add_generation_prompt": True, "messages": [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in this image?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]},
        {"role": "user", "content": [{"type": "text", "text": "And "}, {"type": "text", "text": "now?"}]}]},
]

SNIPPET_CONTEXT = {
    "messages": [SYS, {"role": "user", "content": "Hi é 😀"},
                 {"role": "assistant", "content": "Hello", "tool_calls": [
                     {"type": "function", "function": {"name": "f", "arguments": {"b": 1, "a": "x"}}}]}],
    "tools": None, "documents": None, "add_generation_prompt": True, "bos_token": "<s>", "eos_token": "</s>",
    "d": {"b": 1, "a": [1, 2.5, None, True], "items": "shadow"}, "n": 7, "f": 2.5, "s": "  Hello World  ",
    "l": [3, 1, 2], "e": [], "u": "ÉCOLE ß straße",
}


def render(template, case, tokens):
    try:
        out, _ = render_jinja_template(
            conversations=[case["messages"]], tools=case.get("tools"), chat_template=template,
            add_generation_prompt=case["add_generation_prompt"], **tokens, **case.get("kwargs", {}))
        return True, out[0]
    except Exception as e:  # the C++ renderer must fail on the same inputs
        return False, f"{type(e).__name__}: {e}"


def main():
    expected = DATA / "expected"
    expected.mkdir(parents=True, exist_ok=True)
    for old in expected.glob("*__*"):
        old.unlink()
    manifest = {"generator": f"jinja2 {jinja2.__version__}, transformers {transformers.__version__}",
                "templates": TEMPLATES, "cases": CASES}
    (DATA / "manifest.json").write_text(json.dumps(manifest, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    n_ok = n_err = 0
    for name, tokens in TEMPLATES.items():
        template = (DATA / f"{name}.jinja").read_text(encoding="utf-8")
        for case in CASES:
            ok, out = render(template, case, tokens)
            path = expected / f"{name}__{case['name']}.{'txt' if ok else 'error'}"
            path.write_bytes(out.encode("utf-8"))
            n_ok += ok
            n_err += not ok
    snippets = []
    src = (ROOT / "tests/jinja/constructs.txt").read_text(encoding="utf-8")
    for i, t in enumerate(s for s in src.split("\n=====\n") if s.strip()):
        try:
            snippets.append({"template": t, "output": _compile_jinja_template(t).render(**SNIPPET_CONTEXT)})
        except Exception as e:
            snippets.append({"template": t, "error": f"{type(e).__name__}: {e}"})
    (expected / "constructs.json").write_text(
        json.dumps({"context": SNIPPET_CONTEXT, "snippets": snippets}, ensure_ascii=False, indent=1) + "\n",
        encoding="utf-8")
    print(f"{n_ok} rendered, {n_err} errors, {len(snippets)} snippets")


if __name__ == "__main__":
    main()
