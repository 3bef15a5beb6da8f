// A strict reader of the Prometheus text exposition format (0.0.4) for the tests: every line is
// a comment (# HELP / # TYPE name type) or `name{label="v",…} value`; a sample's family must have
// been typed before it; histogram buckets must be cumulative and end in +Inf = _count. Failures
// are gtest failures naming the line.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <sstream>
#include <string>

namespace cpfill::serve::test {

struct Samples {
    std::map<std::string, double> values;  // "name{labels}" as written → value
    std::map<std::string, std::string> types;
    double get(const std::string& key) const {
        auto it = values.find(key);
        EXPECT_NE(it, values.end()) << "no sample " << key;
        return it == values.end() ? -1 : it->second;
    }
    // Sum over every sample of `name` (all label sets).
    double sum(const std::string& name) const {
        double s = 0;
        for (const auto& [k, v] : values)
            if (k == name || k.rfind(name + "{", 0) == 0) s += v;
        return s;
    }
};

inline bool valid_name(const std::string& s) {
    if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
    for (char c : s)
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != ':') return false;
    return true;
}

inline Samples parse_prometheus(const std::string& text) {
    Samples out;
    std::istringstream in(text);
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
        ++n;
        if (line.empty()) continue;
        if (line[0] == '#') {
            std::istringstream c(line);
            std::string hash, kind, name, type;
            c >> hash >> kind >> name;
            EXPECT_TRUE(kind == "HELP" || kind == "TYPE") << "line " << n << ": " << line;
            EXPECT_TRUE(valid_name(name)) << "line " << n << ": " << line;
            if (kind == "TYPE") {
                c >> type;
                EXPECT_TRUE(type == "counter" || type == "gauge" || type == "histogram")
                    << "line " << n << ": " << line;
                out.types[name] = type;
            }
            continue;
        }
        const size_t sp = line.rfind(' ');
        EXPECT_NE(sp, std::string::npos) << "line " << n << ": " << line;
        if (sp == std::string::npos) continue;
        const std::string key = line.substr(0, sp), value = line.substr(sp + 1);
        const std::string name = key.substr(0, key.find('{'));
        EXPECT_TRUE(valid_name(name)) << "line " << n << ": " << line;
        if (key.find('{') != std::string::npos) {
            EXPECT_EQ(key.back(), '}') << "line " << n << ": " << line;
        }
        std::string family = name;
        for (const char* suffix : {"_bucket", "_sum", "_count"}) {
            const std::string s = suffix;
            if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0 &&
                out.types.count(name.substr(0, name.size() - s.size())))
                family = name.substr(0, name.size() - s.size());
        }
        EXPECT_TRUE(out.types.count(family)) << "line " << n << ": untyped sample " << line;
        char* end = nullptr;
        const double v = std::strtod(value.c_str(), &end);
        EXPECT_TRUE(end != value.c_str() && *end == '\0') << "line " << n << ": " << line;
        EXPECT_FALSE(out.values.count(key)) << "line " << n << ": duplicate " << key;
        out.values[key] = v;
    }
    // Histograms: cumulative buckets, +Inf equal to _count.
    for (const auto& [family, type] : out.types) {
        if (type != "histogram") continue;
        double prev = 0;
        bool inf = false;
        for (const auto& [k, v] : out.values) {
            if (k.rfind(family + "_bucket{", 0) != 0) continue;
            if (k.find("+Inf") != std::string::npos) {
                inf = true;
                EXPECT_EQ(v, out.get(family + "_count")) << family;
            }
        }
        EXPECT_TRUE(inf) << family << " has no +Inf bucket";
        // In the order written (the map sorts the bounds as strings): re-read the text.
        std::istringstream again(text);
        while (std::getline(again, line))
            if (line.rfind(family + "_bucket{", 0) == 0) {
                const double v = std::strtod(line.substr(line.rfind(' ') + 1).c_str(), nullptr);
                EXPECT_GE(v, prev) << family << ": buckets not cumulative at " << line;
                prev = v;
            }
    }
    return out;
}

}  // namespace cpfill::serve::test
