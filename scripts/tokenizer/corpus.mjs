// The parity corpus for make_vectors.mjs: [name, text] pairs chosen to exercise every alternative
// of DeepSeek's pre-tokenizer regexes, the added-token matcher and the BPE (short and long pieces).

const prose = [
    "The quick brown fox jumps over the lazy dog. It wasn't the first time; the dog had seen " +
        "foxes before, and he'd learned that chasing them rarely paid off.",
    "In 1969, Apollo 11 landed on the Moon. Neil Armstrong's words — \"That's one small step " +
        "for [a] man, one giant leap for mankind\" — were heard by an estimated 650 million people.",
    "Long-context prefill splits a prompt of hundreds of thousands of tokens across GPUs; each " +
        "rank computes attention for its slice while exchanging keys and values with its peers.",
    "She said: 'I can't believe it's already 5:30 p.m.!' He replied, \"Well, we'd better hurry, " +
        "then.\" They left at 5:45, e.g. fifteen minutes later (give or take).",
    "Mr. O'Neil's co-workers—three of them—arrived at 9 a.m., i.e., before the meeting; the " +
        "U.S.-based team joined remotely via https://example.com/meet?id=42&lang=en.",
];

const cpp = `// Computes the softmax of each row in place.
#include <algorithm>
#include <cmath>
#include <vector>

template <typename T>
void softmax_rows(std::vector<T>& x, size_t rows, size_t cols) {
    for (size_t r = 0; r < rows; ++r) {
        T* row = x.data() + r * cols;
        const T m = *std::max_element(row, row + cols);
        T sum = 0;
        for (size_t c = 0; c < cols; ++c) {
            row[c] = std::exp(row[c] - m);
            sum += row[c];
        }
        for (size_t c = 0; c < cols; ++c) row[c] /= sum;  // normalise
    }
}
`;

const python = `import json, os
from dataclasses import dataclass


@dataclass
class Config:
    d_model: int = 4096
    n_heads: int = 64
    rope_theta: float = 10000.0

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=2)


def main():
\tcfg = Config()
\tif os.environ.get("DEBUG"):
\t\tprint(f"config = {cfg!r}")   # tabs on purpose
\treturn cfg.to_json()
`;

const js = `const fetchAll = async (urls) => {
  const res = await Promise.all(urls.map((u) => fetch(u).then((r) => r.json())));
  return res.filter(Boolean).reduce((acc, x) => ({ ...acc, [x.id]: x }), {});
};
export default fetchAll; /* EOF */`;

const json_text = `{"model": "deepseek-v4", "layers": 61, "experts": [0, 1, 2, 255],
  "rope": {"theta": 1e6, "scaling": null}, "ok": true, "name": "\\u4f60\\u597d"}`;

const html = `<!DOCTYPE html>
<html lang="en">
  <head><meta charset="utf-8"><title>Test &amp; check</title></head>
  <body>
    <p class="note">Price: $19.99 &mdash; 20% off!</p>
    <a href="mailto:someone@example.org">mail</a>
  </body>
</html>`;

const shell = `#!/bin/bash
set -euo pipefail
for f in *.txt; do
    wc -l "$f" | awk '{print $1}' >> counts.log 2>&1 || echo "failed: $f" >&2
done
export PATH="$HOME/.local/bin:$PATH"; echo \${PATH%%:*}`;

const markdown = `# Results

| model | tokens/s | memory |
|-------|---------:|-------:|
| V3    | 1,234.5  | 80 GiB |
| V4    | 2,345.6  | 96 GiB |

* **Bold** and _italic_ and \`code\`.
> Quote with a [link](http://x.y/z).

---

1. First
2. Second
`;

const latex = String.raw`\begin{equation}
  \mathrm{softmax}(x)_i = \frac{e^{x_i}}{\sum_{j=1}^{n} e^{x_j}}, \quad \forall i \in \{1,\dots,n\}
\end{equation}
Let $\alpha \geq 0$ and $\|v\|_2 \leq 1$; then $\alpha v \in B(0, \alpha)$.`;

const chinese = "深度求索（DeepSeek）发布了新一代大语言模型。该模型采用混合专家架构，总参数量超过六千亿，" +
    "每个词元激活约三百七十亿参数。在数学、代码和推理任务上，它的表现接近甚至超过了许多闭源模型。" +
    "研究人员表示：“我们希望推动开源社区的发展。”";
const chinese_traditional = "臺灣的夜市文化非常豐富，從士林到饒河街，每個夜市都有獨特的小吃與風景。";
const japanese = "東京は日本の首都です。ひらがな、カタカナ、そして漢字を組み合わせて書きます。" +
    "「こんにちは、世界！」と彼は言った。ラーメンが大好きです。ヴァイオリンを弾きます。ｶﾀｶﾅ半角。";
const korean = "안녕하세요! 저는 한국어를 공부하고 있습니다. 서울은 아름다운 도시입니다.";

const mixed_scripts = [
    "Русский текст: Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Ελληνικά: Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Αλφάβητο: αβγδεζηθ.",
    "العربية: مَرْحَبًا بِكُمْ فِي عَالَمِ الذَّكَاءِ الاصْطِنَاعِيِّ ١٢٣٤٥",
    "עברית: שָׁלוֹם עוֹלָם, זֶה מִבְחָן.",
    "हिन्दी: नमस्ते दुनिया। यह एक परीक्षण है। संख्या ४२।",
    "ไทย: สวัสดีครับ ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ",
    "Tiếng Việt: Tôi yêu tiếng Việt, ngôn ngữ có nhiều dấu thanh như ắ, ộ, ữ.",
    "Deutsch: Größenwahn, Übermaß und Straße; Français: où est l'hôtel ? « Très bien ! »",
    "English mixed with 中文 and 日本語のテキスト, plus한국어 and Ελληνικά in one line.",
    "Emoji inside words: cat🐱dog🐶, numbers123abc, snake_case_name, CamelCaseName.",
];

const emoji = [
    "😀😃😄😁😆 👍🏽👋🏿 ❤️ ✨🎉",
    "Family: 👨‍👩‍👧‍👦, couple: 👩‍❤️‍💋‍👨, rainbow flag: 🏳️‍🌈, pirate: 🏴‍☠️.",
    "Flags: 🇺🇸🇨🇳🇯🇵🇩🇪🇫🇷 and keycaps 1️⃣2️⃣#️⃣ and subdivision 🏴󠁧󠁢󠁳󠁣󠁴󠁿.",
    "Newer emoji (Unicode 15-16): 🫨 🩷 🫎 🪼 🫩 🫆 🪾 🫟 and the face 🙂‍↔️ 🧑‍🧑‍🧒.",
    "Text vs emoji presentation: ☺ ☺️ ♥ ♥️ ✔ ✔️ © ®️ ™",
];

const numbers = [
    "1234567890123456789012345678901234567890",
    "Pi ≈ 3.14159265358979323846; e = 2.718281828459045; 1,000,000; 1e-10; 0x1F; -42; +7.",
    "Versions v1.2.3, 2024-01-15T12:34:56Z, 192.168.0.1:8080, ISBN 978-3-16-148410-0.",
    "Other digits: ٠١٢٣٤٥٦٧٨٩ ۱۲۳ ०१२३ １２３４５ ²³¹ ½¾ ⅠⅡⅢⅫ ①②③ 𝟘𝟙𝟚",
    "abc123def4567ghi89 a1b2c3 x99999y",
];

const whitespace = [
    ["spaces_only", "     "],
    ["single_space", " "],
    ["tabs", "\t\t\tindented\twith\ttabs\t\t"],
    ["newlines", "\n\n\nline\n\n\n\nafter\n"],
    ["crlf", "line one\r\nline two\r\n\r\nline four\r\n"],
    ["mixed_ws", "a  \n  b\t \n\t c   \r\n   d    "],
    ["trailing_spaces", "word    "],
    ["leading_spaces", "    word"],
    ["unicode_spaces", "a\u00a0b\u2003c\u3000d\u2028e\u2029f\u202fg\u205fh\u1680i\ufeffj"],
    ["vertical_tab_ff", "a\u000bb\u000cc\u0085d"],
    ["space_before_punct", "Hello , world ! ( yes ) ... ; :"],
    ["long_spaces", " ".repeat(3000) + "x"],
    ["long_tabs_newlines", "\t".repeat(500) + "\n".repeat(500) + "\r\n".repeat(200) + "end"],
    ["ws_between_words", Array.from({ length: 60 }, (_, i) => "w" + " ".repeat(i % 9)).join("")],
];

const specials = [
    ["bos_eos", "<｜begin▁of▁sentence｜>Hello<｜end▁of▁sentence｜>"],
    ["chat", "<｜begin▁of▁sentence｜>You are helpful.<｜User｜>What is 2+2?<｜Assistant｜>4<｜end▁of▁sentence｜>"],
    ["adjacent_specials", "<｜User｜><｜Assistant｜><｜User｜><|EOT|><｜▁pad▁｜>"],
    ["special_in_word", "pre<｜User｜>post and a<|EOT|>b"],
    ["partial_special", "<｜begin▁of▁sent and <｜User and <|EOT| and ｜>"],
    ["tool_calls", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n" +
        "```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"],
    ["fim", "<｜fim▁begin｜>def f(x):\n    <｜fim▁hole｜>\n    return y<｜fim▁end｜>"],
    ["placeholders", "<｜place▁holder▁no▁0｜> <｜place▁holder▁no▁17｜>x<｜place▁holder▁no▁796｜>"],
    ["special_with_spaces", "  <｜User｜>  hi  <｜Assistant｜>\n\n"],
    ["think_tags", "<think>\nreasoning here\n</think>\n\nanswer"],
];

const odd = [
    ["lone_combining", "\u0301abc \u0301 \u0308\u0308x"],
    ["decomposed_accents", "e\u0301te\u0301 cafe\u0301 n\u0303 A\u030a"],
    ["zwj_zwnj_alone", "a\u200db \u200c \u200d\u200d c\u200e\u200f"],
    ["bom_and_replacement", "\ufeffstart \ufffd middle \ufffd\ufffd end"],
    ["private_use", "\ue000\ue001 \uf8ff \u{f0000}\u{10fffd}"],
    ["noncharacters", "\ufdd0 \ufffe \uffff \u{1fffe} x"],
    ["controls", "a\u0000b\u0001c\u0007d\u001be[0m\u007f\u0080\u009f"],
    ["unassigned", "\u0378\u0379 \u{2fffd} \u{e0080} ok"],
    ["variation_selectors", "\u845b\udb40\udd00 \u845b\udb40\udd01 x\ufe0f y\ufe0e"],
    ["soft_hyphen_etc", "co\u00adop\u2060era\u00adtion \u2062 \u2061"],
    ["unicode_17_letters", "\u1c89\u1c8a \ua7cb\ua7cc \u{10d4a}\u{10d4b} \u1ad0\u1ad1"],
    ["math_alphanumerics", "𝐀𝐁𝐂 𝒜ℬ𝒞 𝔸𝔹ℂ 𝟎𝟏𝟐 ∀x∈ℝ: x²≥0 ∑∫∂∇"],
    ["ascii_punct_letters", "#include @user $var .method 'quoted' \"dq\" (paren) [br] {cu} ~tilde `tick`"],
    ["apostrophes", "don't won't I'm you're he's we've they'll I'd O'Reilly rock'n'roll"],
    ["symbol_runs", "$$$ %%% &&& *** +++ === <<<>>> ||| ~~~ ^^^ ... --- ___ /// \\\\\\"],
    ["currency", "€100 £50 ¥1000 ₹500 ₿0.5 $5 ¢ ₩ ₽"],
    ["arrows_boxes", "→ ← ↑ ↓ ⇒ ⇔ ┌─┐│└┘ ■□▲△●○ ★☆ ♠♣♥♦ ♩♪♫"],
    ["fullwidth", "ＡＢＣ　ａｂｃ！？（）［］｛｝：；，。、「」『』【】"],
    ["cjk_outside_range", "\u9fa6\u9fff \u3400\u4db5 \u{20000}\u{2a6d6} \uf900\ufa2d 々〆〇"],
    ["kana_boundaries", "\u3040\u3041ゟ\u30a0゠ヿ\u30ff ㇰ ｦ"],
    ["empty", ""],
    ["single_letter", "a"],
    ["single_newline", "\n"],
    ["single_emoji", "🤖"],
];

const long_runs = [
    ["long_word", "a".repeat(2000)],
    ["long_mixed_word", "ab".repeat(700) + "xyz".repeat(300)],
    ["long_digits", "9876543210".repeat(200)],
    ["long_punct", "!".repeat(1500) + "?".repeat(10) + "\n\n"],
    ["long_dashes", "-".repeat(1000) + "=".repeat(500) + ".".repeat(300)],
    ["long_cjk", "中文字符测试".repeat(300)],
    ["long_emoji", "😀👍🏽👨‍👩‍👧‍👦🇯🇵".repeat(150)],
    ["base64", "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVphYmNkZWZnaGlqa2xtbm9wcXJzdHV2d3h5ejAxMjM0NTY3ODkrLw==".repeat(20)],
    ["hex_dump", Array.from({ length: 64 }, (_, i) => (i * 2654435761 >>> 0).toString(16).padStart(8, "0")).join(" ")],
];

function big_document() {
    const parts = [];
    for (let i = 0; i < 4; ++i) {
        parts.push(`## Section ${i + 1}\n\n` + prose.join(" ") + "\n\n" + chinese + "\n");
        parts.push("```cpp\n" + cpp + "```\n\n" + "```python\n" + python + "```\n");
    }
    return parts.join("\n");
}

export function corpus() {
    const out = [];
    prose.forEach((p, i) => out.push([`prose_${i}`, p]));
    out.push(["prose_all", prose.join("\n\n")]);
    out.push(["code_cpp", cpp], ["code_python", python], ["code_js", js], ["json", json_text]);
    out.push(["html", html], ["shell", shell], ["markdown", markdown], ["latex", latex]);
    out.push(["chinese", chinese], ["chinese_traditional", chinese_traditional]);
    out.push(["japanese", japanese], ["korean", korean]);
    mixed_scripts.forEach((t, i) => out.push([`script_${i}`, t]));
    emoji.forEach((t, i) => out.push([`emoji_${i}`, t]));
    numbers.forEach((t, i) => out.push([`numbers_${i}`, t]));
    out.push(...whitespace, ...specials, ...odd, ...long_runs);
    out.push(["big_document", big_document()]);
    out.push(["chat_transcript", specials[1][1] + "\n" + python + specials[5][1] + chinese +
              "<｜end▁of▁sentence｜>"]);
    return out;
}

// Random strings over pools of characters that stress the class boundaries, and random scalar
// values from every plane (the category table), drawn with the caller's seeded generator.
export function random_texts(rand) {
    const pools = [
        " \t\n\r  aZ09.,;:!?'\"-_()[]{}<>/\\|@#$%^&*+=~`",
        "aé中あア한ب١٢৩²½Ⅻ\u0301\u0308\u200d\ufe0f😀👍🏽🇺 \n\t\u3000\u00a0.,!?。、！「」$€+<=>",
        "<｜User｜><｜Assistant｜><|EOT|>abc 123\n",
    ];
    const pick = (s) => {
        const chars = [...s];
        return chars[Math.floor(rand() * chars.length)];
    };
    const out = [];
    for (let k = 0; k < 12; ++k) {
        const pool = pools[k % pools.length];
        const n = 50 + Math.floor(rand() * (k < 9 ? 400 : 3000));
        let s = "";
        for (let i = 0; i < n; ++i) s += pick(pool);
        out.push([`random_pool_${k}`, s]);
    }
    for (let k = 0; k < 8; ++k) {
        let s = "";
        for (let i = 0; i < 300; ++i) {
            let cp;
            do {
                // Half from the BMP, half from the rest, to reach the supplementary planes.
                cp = rand() < 0.5 ? Math.floor(rand() * 0x10000) : Math.floor(rand() * 0x110000);
            } while (cp >= 0xd800 && cp <= 0xdfff);
            s += String.fromCodePoint(cp);
            if (rand() < 0.2) s += " ";
        }
        out.push([`random_scalars_${k}`, s]);
    }
    return out;
}
