// The benchmarks' one report writer: rows as nccl-tests' text table, CSV or JSON on stdout,
// and optionally as JSON in a file too (-J FILE), which rank prefixes of a launcher cannot
// break. Standard library only and C++17, like the rest of benchmarks/common/.
//
// Each row is written and flushed as soon as it is given (one row per size). JSON is an array
// with one row object a line; a row is a JSON object of its fields in order, NaN and infinity
// are null, and text is escaped, so the output is valid JSON whatever was measured. A run cut
// short leaves every row it finished on a line of its own. CSV has a header line of the field
// names; an absent value, a NaN or an infinity is an empty field. The text table has '#' headers (a
// line of group banners, the column titles, their units) and right-aligned columns, with N/A where
// a row has no value.

#pragma once

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace perf {

/// One value of a row: absent, text, a whole number, or a real number written with a fixed
/// number of decimals.
class value {
public:
    /// Absent: null in JSON, an empty CSV field, N/A in the table.
    value() = default;
    value(const char* s) : kind_(kind::text), text_(s) {}
    value(std::string s) : kind_(kind::text), text_(std::move(s)) {}
    template <class I, std::enable_if_t<std::is_integral_v<I> && !std::is_same_v<I, bool>, int> = 0>
    value(I i) : kind_(kind::integer), integer_(static_cast<long long>(i)) {}
    /// `v` with `decimals` digits after the point; NaN and infinity are null in JSON.
    value(double v, int decimals) : kind_(kind::real), real_(v), decimals_(decimals) {}

    /// As the text table and CSV write it (`absent` where there is no value).
    std::string plain(const char* absent) const {
        switch (kind_) {
            case kind::none:
                return absent;
            case kind::text:
                return text_;
            case kind::integer:
                return std::to_string(integer_);
            case kind::real:
                break;
        }
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.*f", decimals_, real_);
        return buf;
    }

    /// As JSON writes it: null where there is no finite value.
    std::string json() const {
        if (missing()) return "null";
        if (kind_ == kind::text) return quoted(text_);
        return plain("null");
    }

    /// As CSV writes it: an empty field where there is no finite value.
    std::string csv() const { return missing() ? "" : plain(""); }

    /// `s` as a JSON string.
    static std::string quoted(const std::string& s) {
        std::string out = "\"";
        for (char ch : s) {
            auto u = static_cast<unsigned char>(ch);
            if (ch == '"' || ch == '\\') {
                out += '\\';
                out += ch;
            } else if (u < 0x20) {
                char buf[8];
                std::snprintf(buf, sizeof buf, "\\u%04x", u);
                out += buf;
            } else {
                out += ch;
            }
        }
        return out + "\"";
    }

private:
    bool missing() const {
        return kind_ == kind::none || (kind_ == kind::real && !std::isfinite(real_));
    }

    enum class kind { none, text, integer, real };
    kind kind_ = kind::none;
    std::string text_;
    long long integer_ = 0;
    double real_ = 0;
    int decimals_ = 0;
};

/// One field of a row: its name in CSV and JSON, and its value.
struct field {
    std::string key;
    value v;
};
using record = std::vector<field>;

/// A column of the text table: title, unit (the header's second line), width.
struct column {
    std::string title;
    std::string unit;
    int width;
};

/// Columns under one banner (nccl-tests' "out-of-place" / "in-place"); the banner may be empty.
struct column_group {
    std::string banner;
    std::vector<column> columns;
};

/// What stdout carries (none: nothing from the report).
enum class format { none, text, csv, json };

/// The format named by -F's value ("text", "csv" or "json"; anything else is text).
inline format format_of(const std::string& name) {
    return name == "csv" ? format::csv : name == "json" ? format::json : format::text;
}

/// Where one program's rows go. Made on the rank that reports (rank 0); the others make none.
/// Costs a formatted line and a flush per row.
class report {
public:
    /// Rows go to `out` (stdout; nullptr: nowhere, for a program that writes its own text) as
    /// `f`; where `json_path` is not empty, also to that file as JSON (created or truncated).
    /// Throws std::runtime_error naming the file where it cannot be opened.
    explicit report(format f, const std::string& json_path = "", std::FILE* out = stdout)
        : format_(out == nullptr ? format::none : f), out_(out) {
        if (format_ == format::json) json_.push_back({out_, false});
        if (!json_path.empty()) {
            std::FILE* file = std::fopen(json_path.c_str(), "w");
            if (file == nullptr) {
                throw std::runtime_error("cannot write the JSON file " + json_path + ": " +
                                         std::strerror(errno));
            }
            json_.push_back({file, false});
            file_ = file;
            path_ = json_path;
        }
    }
    report(const report&) = delete;
    report& operator=(const report&) = delete;

    /// Closes the JSON arrays (a failed write of the file goes unreported here; see finish).
    ~report() {
        try {
            finish();
        } catch (const std::exception&) {
        }
    }

    /// A line "# ..." above or below the table; nothing in CSV or JSON.
    void comment(const std::string& line) {
        if (format_ != format::text) return;
        std::fprintf(out_, "#%s%s\n", line.empty() ? "" : " ", line.c_str());
        std::fflush(out_);
    }

    /// The text table's columns from now on, and its header; nothing in CSV or JSON. May be
    /// called again, for a new table.
    void table(std::vector<column_group> groups) {
        groups_ = std::move(groups);
        if (format_ != format::text) return;
        bool banners = false;
        std::string banner_line = "#";
        std::string titles = "#";
        std::string units = "#";
        bool first = true;
        for (const auto& g : groups_) {
            banners = banners || !g.banner.empty();
            std::size_t span = 0;
            for (const auto& c : g.columns) {
                std::string gap = first ? "" : " ";
                first = false;
                titles += gap + pad(c.title, c.width);
                units += gap + pad(c.unit, c.width);
                span += gap.size() + static_cast<std::size_t>(c.width);
            }
            banner_line += pad(g.banner, static_cast<int>(span));
        }
        if (banners) std::fprintf(out_, "%s\n", trimmed(banner_line).c_str());
        std::fprintf(out_, "%s\n%s\n", trimmed(titles).c_str(), trimmed(units).c_str());
        std::fflush(out_);
    }

    /// A row: `fields` in CSV and JSON, the fields' values in the table's columns.
    void row(const record& fields) {
        std::vector<value> cells;
        cells.reserve(fields.size());
        for (const auto& f : fields) cells.push_back(f.v);
        row(fields, cells);
    }

    /// A row whose table cells differ from its fields (absent cells print N/A).
    void row(const record& fields, const std::vector<value>& cells) {
        if (format_ == format::text) {
            std::string line = " ";
            std::size_t k = 0;
            for (const auto& g : groups_) {
                for (const auto& c : g.columns) {
                    std::string cell = k < cells.size() ? cells[k].plain("N/A") : "N/A";
                    // Appended piece by piece: g++ 12 at -O3 warns falsely (-Wrestrict) about
                    // `"literal" + std::string`.
                    if (k != 0) line += ' ';
                    line += pad(cell, c.width);
                    ++k;
                }
            }
            std::fprintf(out_, "%s\n", line.c_str());
            std::fflush(out_);
        } else if (format_ == format::csv) {
            if (!csv_header_) {
                std::string head;
                // One append at a time: g++ 12 at -O3 misreads `"," + string` (-Wrestrict).
                for (const auto& f : fields) {
                    if (!head.empty()) head += ',';
                    head += csv_field(f.key);
                }
                std::fprintf(out_, "%s\n", head.c_str());
                csv_header_ = true;
            }
            std::string line;
            for (std::size_t k = 0; k < fields.size(); ++k) {
                if (k != 0) line += ',';
                line += csv_field(fields[k].v.csv());
            }
            std::fprintf(out_, "%s\n", line.c_str());
            std::fflush(out_);
        }
        std::string object = "{";
        for (std::size_t k = 0; k < fields.size(); ++k) {
            object +=
                (k == 0 ? "" : ", ") + value::quoted(fields[k].key) + ": " + fields[k].v.json();
        }
        object += "}";
        for (auto& j : json_) {
            std::fprintf(j.out, "%s  %s", j.rows ? ",\n" : "[\n", object.c_str());
            std::fflush(j.out);
            j.rows = true;
        }
    }

    /// Ends the JSON arrays and closes the file (later rows reach no JSON). Called by the
    /// destructor; call it first to learn of a failed write (throws std::runtime_error).
    void finish() {
        for (auto& j : json_) std::fprintf(j.out, "%s", j.rows ? "\n]\n" : "[]\n");
        json_.clear();
        if (out_ != nullptr) std::fflush(out_);
        if (file_ != nullptr) {
            bool failed = std::ferror(file_) != 0;
            failed = std::fclose(file_) != 0 || failed;
            file_ = nullptr;
            if (failed) throw std::runtime_error("writing the JSON file " + path_ + " failed");
        }
    }

private:
    struct sink {
        std::FILE* out;
        bool rows;
    };

    static std::string pad(const std::string& s, int width) {
        auto w = static_cast<std::size_t>(width);
        return s.size() >= w ? s : std::string(w - s.size(), ' ') + s;
    }

    static std::string trimmed(std::string s) {
        s.erase(s.find_last_not_of(' ') + 1);
        return s;
    }

    static std::string csv_field(const std::string& s) {
        if (s.find_first_of(",\"\n") == std::string::npos) return s;
        std::string out = "\"";
        for (char ch : s) out += ch == '"' ? std::string("\"\"") : std::string(1, ch);
        return out + "\"";
    }

    format format_;
    std::FILE* out_;
    std::vector<column_group> groups_;
    std::vector<sink> json_;
    std::FILE* file_ = nullptr;
    std::string path_;
    bool csv_header_ = false;
};

}  // namespace perf
