#!/usr/bin/python3
"""Renders halo-shell's chat-template goldens with Python jinja2, the way transformers does.

Run with Debian's interpreter (apt-get install -y python3-jinja2):

    /usr/bin/python3 scripts/chat-goldens/gen.py

The environment mirrors transformers' _compile_jinja_template: an ImmutableSandboxedEnvironment
with trim_blocks=True, lstrip_blocks=True and the loopcontrols extension, a `generation` block
tag, `tojson` overridden by json.dumps(ensure_ascii=False, ...), and the raise_exception and
strftime_now globals. Templates are rendered the way apply_chat_template calls them:
render(messages=..., tools=..., documents=None, add_generation_prompt=..., **special_tokens,
**kwargs). strftime_now reads a fixed clock (FIXED_NOW) so that the goldens are stable; the Go
tests pass the same instant.

Inputs: engine/hf/chat/testdata/cases.json and the templates under
engine/hf/chat/testdata/templates/ (plus .cache/testdata/llama3, fetched by
scripts/fetch-testdata.sh, whose rendered goldens may be committed though the template may not).
Outputs: engine/hf/chat/testdata/golden/<template>.json.
"""
import datetime
import json
import os
import sys

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TESTDATA = os.path.join(ROOT, "engine", "hf", "chat", "testdata")
FIXED_NOW = datetime.datetime(2026, 3, 14, 15, 9, 26)

SPECIAL_KEYS = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]


class GenerationTag(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %}: renders its body and, while a tracker is set,
    records the span of the output it produced, as transformers' AssistantTracker does."""

    tags = {"generation"}

    def __init__(self, environment):
        super().__init__(environment)
        environment.extend(generation_tracker=None)

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_support"), [], [], body).set_lineno(lineno)

    def _support(self, caller):
        rv = caller()
        tracker = self.environment.generation_tracker
        if tracker is not None:
            blocks, spans = tracker
            start = len("".join(blocks))
            spans.append((start, start + len(rv)))
        return rv


def render_with_spans(env, template, **kwargs):
    """Renders like transformers' _render_with_assistant_indices; spans are UTF-8 byte offsets."""
    blocks, spans = [], []
    env.generation_tracker = (blocks, spans)
    try:
        for block in template.generate(**kwargs):
            blocks.append(block)
    finally:
        env.generation_tracker = None
    text = "".join(blocks)
    to_bytes = lambda i: len(text[:i].encode("utf-8"))
    return text, [[to_bytes(a), to_bytes(b)] for a, b in spans]


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return FIXED_NOW.strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def token_string(v):
    if isinstance(v, dict):
        return v.get("content")
    return v


def load_template_dir(path):
    """Returns (templates, special tokens) the way transformers reads a tokenizer directory."""
    cfg = {}
    cfg_path = os.path.join(path, "tokenizer_config.json")
    if os.path.exists(cfg_path):
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)
    specials = {}
    for key in SPECIAL_KEYS:
        v = token_string(cfg.get(key))
        if v is not None:
            specials[key] = v
    extra = cfg.get("additional_special_tokens")
    if extra:
        specials["additional_special_tokens"] = [token_string(t) for t in extra]
    jinja_path = os.path.join(path, "chat_template.jinja")
    if os.path.exists(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            return {"default": f.read()}, specials
    tmpl = cfg.get("chat_template")
    if isinstance(tmpl, list):
        return {t["name"]: t["template"] for t in tmpl}, specials
    return {"default": tmpl}, specials


def pick(templates, tools):
    if tools is not None and "tool_use" in templates:
        return templates["tool_use"]
    return templates["default"]


def build_stress():
    """Assembles the named-list tokenizer_config.json of the stress template from its sources."""
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")
    names = [("default", "stress_default.jinja"), ("tool_use", "stress_tool_use.jinja")]
    tmpl = []
    for name, fname in names:
        with open(os.path.join(here, fname), encoding="utf-8") as f:
            tmpl.append({"name": name, "template": f.read()})
    cfg = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": None, "chat_template": tmpl}
    out = os.path.join(TESTDATA, "templates", "stress")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)
        f.write("\n")


def render_snippets(env):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from snippets import SNIPPETS

    out = []
    names = set()
    for name, src, variables in SNIPPETS:
        assert name not in names, name
        names.add(name)
        entry = {"name": name, "template": src, "vars": variables}
        try:
            entry["output"] = env.from_string(src).render(**variables)
        except Exception as e:
            entry["error"] = f"{type(e).__name__}: {e}"
        out.append(entry)
    dest = os.path.join(TESTDATA, "golden", "snippets.json")
    with open(dest, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"snippets: {len(out)} renders -> {os.path.relpath(dest, ROOT)}")


def render_masks(env, cases):
    """For templates rewritten with {% generation %} blocks around assistant output, records the
    rendered text and the generation spans. The Go mask finder, run on the original template
    (which has no such blocks), must find the same spans."""
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")
    pairs = {
        "qwen3": (os.path.join(TESTDATA, "templates", "qwen3"), "qwen3_generation.jinja"),
        "llama3": (os.path.join(ROOT, ".cache", "testdata", "llama3"), "llama3_generation.jinja"),
    }
    for name, (orig_dir, marked_file) in sorted(pairs.items()):
        if not os.path.isdir(orig_dir):
            print(f"skip masks for {name}: {orig_dir} is missing", file=sys.stderr)
            continue
        templates, specials = load_template_dir(orig_dir)
        original = env.from_string(templates["default"])
        with open(os.path.join(here, marked_file), encoding="utf-8") as f:
            marked = env.from_string(f.read())
        out = []
        for case in cases:
            if not any(m["role"] == "assistant" for m in case["messages"]):
                continue
            has_reasoning = any(
                m.get("reasoning_content") or "</think>" in str(m.get("content")) for m in case["messages"]
            )
            # thinking off with reasoning in the data is contradictory: no golden for it
            variants = [{}] if has_reasoning or name != "qwen3" else [{}, {"enable_thinking": False}]
            for kw_variant in variants:
                kwargs = dict(specials)
                kwargs.update(case.get("kwargs", {}))
                kwargs.update(kw_variant)
                args = dict(messages=case["messages"], tools=case.get("tools"), documents=None, add_generation_prompt=False)
                try:
                    want = original.render(**args, **kwargs)
                except Exception:
                    continue
                text, spans = render_with_spans(env, marked, **args, **kwargs)
                assert text == want, (name, case["name"], text, want)
                out.append({"case": case["name"], "kwargs": kw_variant, "text": text, "spans": spans})
        dest = os.path.join(TESTDATA, "golden", "masks_" + name + ".json")
        with open(dest, "w", encoding="utf-8") as f:
            json.dump(out, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print(f"masks {name}: {len(out)} conversations -> {os.path.relpath(dest, ROOT)}")


def random_whitespace_templates(n, seed=1234):
    """Random nestings of tags, whitespace control and text: the lexer's hardest cases."""
    import random

    rng = random.Random(seed)
    texts = ["", " ", "  ", "\t", "\n", "\n\n", " \n ", "\t\n  ", "a", "b c", " d\n", "\ne ", "x\n  y\n"]
    opens = ["{%", "{%-", "{%+"]
    closes = ["%}", "-%}", "+%}"]

    def tag(body):
        return rng.choice(opens) + " " + body + " " + rng.choice(closes)

    def var():
        o = rng.choice(["{{", "{{-"])
        c = rng.choice(["}}", "-}}"])
        return o + " " + rng.choice(["'v'", "1", "'\\n'", "' '", "i"]) + " " + c

    def comment():
        return rng.choice(["{#", "{#-"]) + " c " + rng.choice(["#}", "-#}"])

    def block(depth):
        parts = []
        for _ in range(rng.randint(1, 4)):
            parts.append(rng.choice(texts))
            r = rng.random()
            if r < 0.25 and depth < 3:
                parts.append(tag("if true"))
                parts.append(block(depth + 1))
                if rng.random() < 0.3:
                    parts.append(tag("else"))
                    parts.append(block(depth + 1))
                parts.append(tag("endif"))
            elif r < 0.45 and depth < 3:
                parts.append(tag("for i in range(2)"))
                parts.append(block(depth + 1))
                parts.append(tag("endfor"))
            elif r < 0.65:
                parts.append(var())
            elif r < 0.75:
                parts.append(comment())
            elif r < 0.85:
                parts.append(tag("set z = 1"))
            elif r < 0.9:
                parts.append(rng.choice(["{% raw %}", "{%- raw -%}"]) + rng.choice(texts) + "{{ r }}" + rng.choice(texts) + rng.choice(["{% endraw %}", "{%- endraw -%}"]))
        parts.append(rng.choice(texts))
        return "".join(parts)

    return [block(0) for _ in range(n)]


EXPR_VARS = {"d": {"b": 2, "a": [1, "x"]}, "l": [3, 1, 2], "s": "Hello World", "f": 2.5, "n": None, "e": ""}


def random_expressions(n, seed=4321):
    """Random expressions over the values, operators, filters, tests and methods templates use."""
    import random

    rng = random.Random(seed)
    atoms = ["0", "1", "-2", "3.5", "0.1", "1e20", "'a'", "''", "'Ab c'", "\"x'y\"", "[1, 2]", "[]", "['b', 'a']",
             "{'k': 1}", "none", "true", "false", "missing", "d", "l", "s", "f", "n", "e", "(1, 'a')"]
    binops = ["+", "-", "*", "/", "//", "%", "~", "==", "!=", "<", "<=", ">", ">=", "in", "not in", "and", "or"]
    filters = ["length", "string", "upper", "lower", "trim", "first", "last", "reverse | list", "list", "sort", "unique | list",
               "join(',')", "tojson", "int", "float", "abs", "default('z')", "default('z', true)", "items | list", "capitalize",
               "title", "wordcount", "round", "sum", "max", "min", "count", "select | list", "reject | list", "map('string') | list",
               "tojson(indent=1)", "replace('a', 'b')", "dictsort"]
    tests = ["defined", "undefined", "none", "string", "number", "mapping", "iterable", "sequence", "odd", "even",
             "integer", "float", "boolean", "true", "false", "lower", "upper", "in [1, 'a']", "eq 1", "divisibleby 2"]
    methods = [".upper()", ".strip()", ".split()", ".startswith('a')", ".replace('a', 'b')", ".find('b')", ".items()",
               ".get('b')", ".keys()", ".count('l')", ".title()", ".lstrip('H')", ".endswith(('d', 'x'))", ".split('o', 1)"]

    def expr(depth):
        r = rng.random()
        if depth <= 0 or r < 0.3:
            return rng.choice(atoms)
        if r < 0.5:
            return "(" + expr(depth - 1) + " " + rng.choice(binops) + " " + expr(depth - 1) + ")"
        if r < 0.62:
            return "(" + expr(depth - 1) + " | " + rng.choice(filters) + ")"
        if r < 0.7:
            return "(" + expr(depth - 1) + " is " + rng.choice(["", "not "]) + rng.choice(tests) + ")"
        if r < 0.78:
            return "(" + expr(depth - 1) + ")" + rng.choice(methods)
        if r < 0.86:
            return "(" + expr(depth - 1) + ")" + rng.choice(["[0]", "[-1]", "[1:]", "[::-1]", "['b']", "[:2]"])
        if r < 0.93:
            return "(" + rng.choice(["not ", "-"]) + expr(depth - 1) + ")"
        return "(" + expr(depth - 1) + " if " + expr(depth - 1) + " else " + expr(depth - 1) + ")"

    return ["{{ " + expr(3) + " }}" for _ in range(n)]


def render_expressions(env):
    out = []
    for i, src in enumerate(random_expressions(1500)):
        entry = {"name": f"expr_{i}", "template": src, "vars": EXPR_VARS}
        try:
            entry["output"] = env.from_string(src).render(**EXPR_VARS)
        except Exception as e:
            entry["error"] = f"{type(e).__name__}: {e}"
        out.append(entry)
    dest = os.path.join(TESTDATA, "golden", "expressions.json")
    with open(dest, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(f"expressions: {len(out)} renders -> {os.path.relpath(dest, ROOT)}")


def random_programs(n, seed=99):
    """Random statements that stress scoping: set in loops, ifs and macros, namespaces, loop
    variables, break and continue."""
    import random

    rng = random.Random(seed)
    names = ["a", "b", "c"]
    vals = ["1", "'x'", "a ~ 'y'", "(b | default(0) | string) ~ '!'", "ns.v ~ 1", "[1, 2]", "loop.index if loop is defined else 0",
            "i if i is defined else 'noi'", "c | default('dc')"]

    def stmts(depth, in_loop, in_macro):
        out = []
        for _ in range(rng.randint(1, 4)):
            r = rng.random()
            if r < 0.25:
                out.append("{% set " + rng.choice(names) + " = " + rng.choice(vals) + " %}")
            elif r < 0.4:
                out.append("[{{ a | default('-') }},{{ b | default('-') }},{{ c | default('-') }},{{ ns.v }}]")
            elif r < 0.5:
                out.append("{% set ns.v = " + rng.choice(vals) + " %}")
            elif r < 0.65 and depth < 3:
                it = rng.choice(["[1, 2, 3]", "range(2)", "'ab'", "[]"])
                cond = rng.choice(["", " if i != 2"])
                body = stmts(depth + 1, True, in_macro)
                els = ("{% else %}" + stmts(depth + 1, in_loop, in_macro)) if rng.random() < 0.2 else ""
                out.append("{% for i in " + it + cond + " %}" + body + els + "{% endfor %}")
            elif r < 0.78 and depth < 3:
                cond = rng.choice(["a is defined", "b == 1", "true", "false", "ns.v", "i is defined and i > 1"])
                out.append("{% if " + cond + " %}" + stmts(depth + 1, in_loop, in_macro) + "{% else %}" + stmts(depth + 1, in_loop, in_macro) + "{% endif %}")
            elif r < 0.85 and in_loop:
                out.append(rng.choice(["{% if i == 1 %}{% break %}{% endif %}", "{% if i == 0 %}{% continue %}{% endif %}", "({{ loop.index }}/{{ loop.length }})"]))
            elif r < 0.92:
                out.append("{{ m(" + rng.choice(["", "1", "a | default(5)"]) + ") }}")
            else:
                out.append("{{ " + rng.choice(vals) + " }}")
        return "".join(out)

    progs = []
    for _ in range(n):
        head = "{% set ns = namespace(v=0) %}{% macro m(p=0) %}<m{{ p }}{{ a | default('') }}{% set a = 'macro' %}{{ a }}>{% endmacro %}"
        progs.append(head + stmts(0, False, False) + "|{{ a | default('-') }},{{ b | default('-') }},{{ c | default('-') }},{{ ns.v }}")
    return progs


def random_block_programs(n, seed=2024):
    """Random nestings of macros, call blocks, filter blocks, set blocks, with blocks and loops
    using loop variables, cyclers, joiners and namespaces."""
    import random

    rng = random.Random(seed)
    leaves = ["{{ x }}", "{{ y | default('Y') }}", "{{ loop.index ~ '/' ~ loop.revindex if loop is defined else 'nl' }}",
              "{{ loop.previtem | default('p-') }}{{ loop.nextitem | default('n-') }}", "{% set x = x ~ 'a' %}", "{{ j() }}",
              "{{ c.next() }}", "{{ caller() if caller is defined else 'nc' }}", "{{ f(1) }}", "{{ f(2, y='q') }}",
              "{% set ns.t = ns.t ~ x %}", "{{ ns.t }}", "{{ varargs if varargs is defined else '' }}",
              "{{ loop.first }}{{ loop.last }}", "{{ loop.cycle('A','B') }}"]

    def block(d):
        out = []
        for _ in range(rng.randint(1, 3)):
            r = rng.random()
            if r < 0.4 or d >= 3:
                out.append(rng.choice(leaves))
            elif r < 0.55:
                it = rng.choice(["['u','v']", "'ab'", "{'k1':1,'k2':2}", "range(3)"])
                out.append("{% for x in " + it + " %}" + block(d + 1) + "{% endfor %}")
            elif r < 0.65:
                out.append("{% filter upper %}" + block(d + 1) + "{% endfilter %}")
            elif r < 0.75:
                out.append("{% set y %}" + block(d + 1) + "{% endset %}")
            elif r < 0.85:
                out.append("{% call f(3) %}" + block(d + 1) + "{% endcall %}")
            elif r < 0.92:
                out.append("{% with x = 'w' %}" + block(d + 1) + "{% endwith %}")
            else:
                out.append("{% if x == 'a' %}" + block(d + 1) + "{% else %}" + block(d + 1) + "{% endif %}")
        return "".join(out)

    progs = []
    for _ in range(n):
        body = rng.choice(["", "{{ caller() if caller is defined else '' }}", "{% set x = 'mx' %}{{ x }}"])
        head = ("{% set ns = namespace(t='') %}{% set j = joiner('|') %}{% set c = cycler('c1','c2') %}{% set x = 'top' %}"
                "{% macro f(a, y='fy') %}[{{ a }}{{ y }}{{ x }}" + body + "]{% endmacro %}")
        progs.append(head + block(0) + "|{{ x }}{{ y | default('-') }}{{ ns.t }}")
    return progs


def render_programs(env):
    out = []
    for i, src in enumerate(random_programs(500) + random_block_programs(500)):
        entry = {"name": f"program_{i}", "template": src, "vars": {}}
        try:
            entry["output"] = env.from_string(src).render()
        except Exception as e:
            entry["error"] = f"{type(e).__name__}: {e}"
        out.append(entry)
    dest = os.path.join(TESTDATA, "golden", "programs.json")
    with open(dest, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(f"programs: {len(out)} renders -> {os.path.relpath(dest, ROOT)}")


def render_whitespace(env):
    out = []
    for i, src in enumerate(random_whitespace_templates(400)):
        entry = {"name": f"random_{i}", "template": src, "vars": {}}
        try:
            entry["output"] = env.from_string(src).render()
        except Exception as e:
            entry["error"] = f"{type(e).__name__}: {e}"
        out.append(entry)
    dest = os.path.join(TESTDATA, "golden", "whitespace.json")
    with open(dest, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"whitespace: {len(out)} renders -> {os.path.relpath(dest, ROOT)}")


def main():
    build_stress()
    render_snippets(make_env())
    render_whitespace(make_env())
    render_expressions(make_env())
    render_programs(make_env())
    with open(os.path.join(TESTDATA, "cases.json"), encoding="utf-8") as f:
        render_masks(make_env(), json.load(f))
    with open(os.path.join(TESTDATA, "cases.json"), encoding="utf-8") as f:
        cases = json.load(f)
    dirs = {
        name: os.path.join(TESTDATA, "templates", name)
        for name in ["qwen3", "deepseek_v3", "chatml_tools", "stress", "gpt_oss", "qwen3_5", "ministral3", "deepseek_v4", "glm5"]
    }
    dirs["llama3"] = os.path.join(ROOT, ".cache", "testdata", "llama3")
    env = make_env()
    for name, path in sorted(dirs.items()):
        if not os.path.isdir(path):
            print(f"skip {name}: {path} is missing (run scripts/fetch-testdata.sh)", file=sys.stderr)
            continue
        templates, specials = load_template_dir(path)
        compiled = {k: env.from_string(v) for k, v in templates.items()}
        out = []
        for case in cases:
            if "only" in case and name not in case["only"]:
                continue
            if name in case.get("not", []):
                continue
            tools = case.get("tools")
            key = "tool_use" if tools is not None and "tool_use" in compiled else "default"
            for agp in (False, True):
                kwargs = dict(specials)
                kwargs.update(case.get("kwargs", {}))
                entry = {"case": case["name"], "add_generation_prompt": agp}
                try:
                    entry["output"] = compiled[key].render(
                        messages=case["messages"], tools=tools, documents=None, add_generation_prompt=agp, **kwargs
                    )
                except Exception as e:  # the Go renderer must fail on the same inputs
                    entry["error"] = f"{type(e).__name__}: {e}"
                out.append(entry)
        dest = os.path.join(TESTDATA, "golden", name + ".json")
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with open(dest, "w", encoding="utf-8") as f:
            json.dump(out, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print(f"{name}: {len(out)} renders -> {os.path.relpath(dest, ROOT)}")


if __name__ == "__main__":
    main()
