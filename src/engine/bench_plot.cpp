// report_svg: tokens/s per GPU against prompt length, one polyline per (cp, tbo) series, written
// by hand (no plotting library): log₂ length axis with a tick at each measured length, linear y
// axis with "nice" ticks from 0, a legend, and a note on skipped rows. Colour by cp, dashes for
// TBO.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "engine/bench_report.h"

namespace cpfill {

namespace {

std::string xml_escape(const std::string& s) {
    std::string out;
    for (char ch : s) {
        switch (ch) {
            case '&':
                out += "&amp;";
                break;
            case '<':
                out += "&lt;";
                break;
            case '>':
                out += "&gt;";
                break;
            case '"':
                out += "&quot;";
                break;
            case '\'':
                out += "&apos;";
                break;
            default:
                out += ch;
        }
    }
    return out;
}

// 1, 2 or 5 × 10^k, at least x.
double nice_step(double x) {
    const double p = std::pow(10.0, std::floor(std::log10(x)));
    const double m = x / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

// 150000 → "150k" when every tick is a whole number of thousands.
std::string tick_label(double v, double step) {
    if (v == 0) return "0";
    if (step >= 1000 && std::fmod(step, 1000) == 0) return fmt::format("{:.0f}k", v / 1000);
    return step >= 1 ? fmt::format("{:.0f}", v) : fmt::format("{:g}", v);
}

struct Series {
    int cp = 1;
    std::string tbo;
    std::string weights;
    std::vector<std::pair<int64_t, double>> points;  // (length, tokens/s per GPU), by length
};

std::vector<Series> collect_series(const BenchReport& r) {
    std::vector<Series> out;
    for (const BenchRow& row : r.rows) {
        auto it = std::find_if(out.begin(), out.end(), [&](const Series& s) {
            return s.cp == row.cp && s.tbo == row.tbo && s.weights == row.weights;
        });
        if (it == out.end()) it = out.insert(out.end(), Series{row.cp, row.tbo, row.weights, {}});
        if (row.measured() && row.tokens_per_s_per_gpu > 0)
            it->points.push_back({row.length, row.tokens_per_s_per_gpu});
    }
    for (Series& s : out) std::sort(s.points.begin(), s.points.end());
    return out;
}

constexpr const char* kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                    "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};

// Plot area in SVG units.
struct Frame {
    double width = 780, height = 460, left = 80, right = 200, top = 50, bottom = 70;
    double x0 = 0, x1 = 1;  // log2(length) at the left and right edges
    double y1 = 1;          // tokens/s per GPU at the top edge
    double px(int64_t length) const {
        const double u = (std::log2(static_cast<double>(length)) - x0) / (x1 - x0);
        return left + u * (width - left - right);
    }
    double py(double v) const { return top + (1 - v / y1) * (height - top - bottom); }
};

std::string axes(const Frame& f, const std::set<int64_t>& lengths, double step) {
    std::string s;
    const double xl = f.left, xr = f.width - f.right, yb = f.height - f.bottom;
    for (double v = 0; v <= f.y1 + step / 2; v += step) {  // y ticks and grid
        const double y = f.py(v);
        s += fmt::format(
            "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>\n", xl,
            y, xr, y);
        s += fmt::format(
            "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" "
            "dominant-baseline=\"middle\">{}</text>\n",
            xl - 6, y, tick_label(v, step));
    }
    for (int64_t n : lengths) {  // x ticks at the measured lengths
        const double x = f.px(n);
        s += fmt::format(
            "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"black\"/>\n", x,
            yb, x, yb + 5);
        s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", x,
                         yb + 20, xml_escape(format_length(n)));
    }
    s += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" stroke=\"black\"/>\n"
        "<line x1=\"{0:.1f}\" y1=\"{3:.1f}\" x2=\"{0:.1f}\" y2=\"{1:.1f}\" stroke=\"black\"/>\n",
        xl, yb, xr, f.top);
    s += fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">prompt length (tokens, log "
        "scale)</text>\n",
        (xl + xr) / 2, yb + 45);
    s += fmt::format(
        "<text transform=\"translate({:.1f},{:.1f}) rotate(-90)\" "
        "text-anchor=\"middle\">tokens/s per GPU</text>\n",
        f.left - 60, (f.top + yb) / 2);
    return s;
}

std::string series_svg(const Frame& f, const Series& s, size_t index, int cp_index) {
    const char* colour = kColours[cp_index % std::size(kColours)];
    const std::string dash = s.tbo == "off" ? "" : " stroke-dasharray=\"7 4\"";
    std::string out;
    if (!s.points.empty()) {
        std::string pts;
        for (auto [n, v] : s.points) pts += fmt::format("{:.1f},{:.1f} ", f.px(n), f.py(v));
        pts.pop_back();
        out += fmt::format(
            "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\"{} points=\"{}\"/>\n", colour,
            dash, pts);
        for (auto [n, v] : s.points)
            out += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n",
                               f.px(n), f.py(v), colour);
    }
    const double lx = f.width - f.right + 15, ly = f.top + 10 + 20.0 * index;
    out += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" "
        "stroke-width=\"2\"{}/>\n",
        lx, ly, lx + 28, ly, colour, dash);
    const std::string label =
        fmt::format("cp={}, TBO {}{}{}", s.cp, s.tbo, s.weights == "bf16" ? "" : ", " + s.weights,
                    s.points.empty() ? " (skipped)" : "");
    out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" dominant-baseline=\"middle\">{}</text>\n",
                       lx + 34, ly, xml_escape(label));
    return out;
}

}  // namespace

std::string report_svg(const BenchReport& r) {
    const std::vector<Series> series = collect_series(r);
    std::set<int64_t> lengths;
    double vmax = 0;
    for (const Series& s : series)
        for (auto [n, v] : s.points) lengths.insert(n), vmax = std::max(vmax, v);
    if (lengths.empty())
        for (const BenchRow& row : r.rows)
            if (row.length > 0) lengths.insert(row.length);
    Frame f;
    if (!lengths.empty()) {
        f.x0 = std::log2(static_cast<double>(*lengths.begin()));
        f.x1 = std::log2(static_cast<double>(*lengths.rbegin()));
    }
    const double pad = std::max(0.5, 0.06 * (f.x1 - f.x0));  // keep end points off the frame
    f.x0 -= pad, f.x1 += pad;
    const double step = vmax > 0 ? nice_step(vmax / 5) : 0.2;
    f.y1 = vmax > 0 ? std::ceil(1.05 * vmax / step) * step : 1;  // headroom above the top point

    std::string s = fmt::format(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0:.0f}\" height=\"{1:.0f}\" "
        "viewBox=\"0 0 {0:.0f} {1:.0f}\" font-family=\"sans-serif\" font-size=\"12\">\n"
        "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
        f.width, f.height);
    const std::string title = fmt::format("cpfill bench: preset {}, {} layers, {}", r.preset,
                                          r.config.n_layers, r.device);
    s += fmt::format(
        "<text x=\"{:.1f}\" y=\"28\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n",
        (f.left + f.width - f.right) / 2, xml_escape(title));
    s += axes(f, lengths, step);
    std::vector<int> cps;
    for (const Series& se : series)
        if (std::find(cps.begin(), cps.end(), se.cp) == cps.end()) cps.push_back(se.cp);
    for (size_t i = 0; i < series.size(); ++i) {
        const int cp_index =
            static_cast<int>(std::find(cps.begin(), cps.end(), series[i].cp) - cps.begin());
        s += series_svg(f, series[i], i, cp_index);
    }
    const auto skipped = std::count_if(r.rows.begin(), r.rows.end(),
                                       [](const BenchRow& row) { return !row.measured(); });
    if (skipped > 0)
        s += fmt::format(
            "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\">{} row(s) skipped: see the "
            "table</text>\n",
            f.width - f.right + 15, f.height - f.bottom, skipped);
    return s + "</svg>\n";
}

}  // namespace cpfill
