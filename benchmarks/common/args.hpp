// The benchmarks' one command-line parser: coll_perf, gpu_coll_perf, overlap, startup_probe,
// move_apart and compare/gloo_perf read their options through it. Standard library only and
// C++17, so that the comparison programs that do not use corocoll include it too.
//
// An option is declared against the variable it sets; the variable's value before parsing is
// the default --help shows. Every option but --help takes one value, written `-b 4`, `-b4`,
// `--minbytes 4` or `--minbytes=4`. An unknown option, a missing value or a value that does
// not parse is a usage_error whose message names the option and the value; parse_or_exit
// prints it and exits 2, and prints the help and exits 0 on -h or --help.
//
// Sizes are a whole number of bytes: digits, an optional decimal fraction and an optional K, M
// or G (powers of 1024, as nccl-tests reads them). 1.5M is 1572864; 1.3M (1363148.8 bytes) is
// refused, never rounded.

#pragma once

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace perf {

/// A command line that cannot be run: an unknown option, or a value that is missing or does not
/// parse. The message names the option and the value.
class usage_error : public std::invalid_argument {
public:
    using std::invalid_argument::invalid_argument;
};

/// `text` as a size in bytes (see the top of this file), exactly. Throws usage_error naming
/// `flag` where it is not a whole number of bytes or does not fit a size_t.
inline std::size_t parse_size(const std::string& flag, const std::string& text) {
    auto fail = [&](const char* why) { return usage_error(flag + " " + text + ": " + why); };
    const char* expected = "expected a size in bytes: digits, an optional fraction and K, M or G";
    // The number is digits / 10^decimals * 2^twos, kept as one integer and reduced exactly.
    unsigned long long digits = 0;
    int decimals = 0;
    int twos = 0;
    bool any_digit = false;
    bool point = false;
    std::size_t i = 0;
    for (; i < text.size(); ++i) {
        char ch = text[i];
        if (ch == '.' && !point) {
            point = true;
            continue;
        }
        if (ch < '0' || ch > '9') break;
        auto d = static_cast<unsigned long long>(ch - '0');
        if (digits > (std::numeric_limits<unsigned long long>::max() - d) / 10) {
            throw fail("too many digits");
        }
        digits = digits * 10 + d;
        decimals += point ? 1 : 0;
        any_digit = true;
    }
    if (i + 1 == text.size()) {
        char unit = text[i];
        twos = unit == 'K' || unit == 'k'   ? 10
               : unit == 'M' || unit == 'm' ? 20
               : unit == 'G' || unit == 'g' ? 30
                                            : -1;
        if (twos >= 0) ++i;
    }
    if (!any_digit || i != text.size()) throw fail(expected);
    // Each power of ten in the divisor takes a 2 from the unit (leaving a 5 to divide by), or
    // divides the digits by 10 where the unit has no 2 left.
    for (; decimals > 0; --decimals) {
        if (twos > 0 && digits % 5 == 0) {
            digits /= 5;
            --twos;
        } else if (digits % 10 == 0) {
            digits /= 10;
        } else {
            throw fail("not a whole number of bytes");
        }
    }
    if (digits > (std::numeric_limits<std::size_t>::max() >> twos)) throw fail("too large");
    return static_cast<std::size_t>(digits) << twos;
}

/// `bytes` as the shortest size parse_size reads back: 33554432 is "32M", 1536 "1536".
inline std::string format_size(std::size_t bytes) {
    const char* units = "GMK";
    for (int k = 0; k < 3; ++k) {
        int shift = 30 - 10 * k;
        std::size_t scale = std::size_t{1} << shift;
        if (bytes >= scale && bytes % scale == 0) {
            return std::to_string(bytes >> shift) + units[k];
        }
    }
    return std::to_string(bytes);
}

/// `v` without trailing zeros: 1 is "1", 1.5 is "1.5".
inline std::string format_real(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
}

/// `text` as a whole number in [lo, hi]. Throws usage_error naming `flag` otherwise.
inline long long parse_int(const std::string& flag, const std::string& text, long long lo,
                           long long hi) {
    const char* s = text.c_str();
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(s, &end, 10);
    bool whole = !text.empty() && end == s + text.size() && errno == 0 && text[0] != ' ';
    if (!whole || v < lo || v > hi) {
        std::string range = hi == std::numeric_limits<long long>::max()
                                ? ">= " + std::to_string(lo)
                                : "from " + std::to_string(lo) + " to " + std::to_string(hi);
        throw usage_error(flag + " " + text + ": expected a whole number " + range);
    }
    return v;
}

/// `text` as a finite number above `above`. Throws usage_error naming `flag` otherwise.
inline double parse_real_above(const std::string& flag, const std::string& text, double above) {
    const char* s = text.c_str();
    char* end = nullptr;
    double v = std::strtod(s, &end);
    bool number = !text.empty() && end == s + text.size() && text[0] != ' ';
    // `!(v > above)` also refuses NaN; the upper bound refuses inf.
    if (!number || !(v > above) || !(v <= std::numeric_limits<double>::max())) {
        throw usage_error(flag + " " + text + ": expected a number above " + format_real(above));
    }
    return v;
}

/// The options of one program, each bound to the variable it sets, and their --help text.
/// Costs nothing after parsing: it is used once, at start-up.
class args {
public:
    /// `program` heads the usage line and the error messages; `summary` is the help's first
    /// paragraph.
    args(std::string program, std::string summary)
        : program_(std::move(program)), summary_(std::move(summary)) {}

    /// The program's name, as error messages begin.
    const std::string& program() const { return program_; }

    /// `names` is a comma-separated list ("-b,--minbytes"); a size (see parse_size) of at least
    /// `lo` bytes.
    args& size(const std::string& names, std::size_t& out, const std::string& help,
               std::size_t lo = 0) {
        return add(
            names, "SIZE", help, format_size(out),
            [&out, lo](const std::string& flag, const std::string& v) {
                std::size_t s = parse_size(flag, v);
                if (s < lo) {
                    throw usage_error(flag + " " + v + ": at least " + format_size(lo) + " bytes");
                }
                out = s;
            });
    }

    /// A whole number in [lo, hi].
    args& integer(const std::string& names, int& out, int lo, int hi, const std::string& help) {
        return add(names, "N", help, std::to_string(out),
                   [&out, lo, hi](const std::string& flag, const std::string& v) {
                       out = static_cast<int>(parse_int(flag, v, lo, hi));
                   });
    }

    /// A number above `above` (and finite).
    args& real_above(const std::string& names, double& out, double above, const std::string& help) {
        return add(names, "X", help, format_real(out),
                   [&out, above](const std::string& flag, const std::string& v) {
                       out = parse_real_above(flag, v, above);
                   });
    }

    /// 0 or 1, as nccl-tests' -c.
    args& boolean(const std::string& names, bool& out, const std::string& help) {
        return add(names, "0|1", help, out ? "1" : "0",
                   [&out](const std::string& flag, const std::string& v) {
                       out = parse_int(flag, v, 0, 1) != 0;
                   });
    }

    /// Any text (a file name, say); `metavar` names it in the help.
    args& text(const std::string& names, std::string& out, const std::string& metavar,
               const std::string& help) {
        return add(names, metavar, help, out,
                   [&out](const std::string&, const std::string& v) { out = v; });
    }

    /// One of `known`.
    args& one_of(const std::string& names, std::string& out, std::vector<std::string> known,
                 const std::string& help) {
        // A long list goes in the help text, where it can be wrapped.
        std::string list = join(known, "|");
        bool short_list = list.size() <= 16;
        return add(names, short_list ? list : "NAME",
                   short_list ? help : help + ": " + join(known, ", "), out,
                   [&out, known](const std::string& flag, const std::string& v) {
                       out = pick(flag, v, known, false).front();
                   });
    }

    /// A comma-separated list of `known` names, or `all` for every one of them, in their order.
    args& some_of(const std::string& names, std::vector<std::string>& out,
                  std::vector<std::string> known, const std::string& help) {
        return add(names, "LIST", help + ": " + join(known, ", ") + ", all, or several with commas",
                   join(out, ","), [&out, known](const std::string& flag, const std::string& v) {
                       out = pick(flag, v, known, true);
                   });
    }

    /// An option this program no longer takes: refused with `hint`, which says what to use.
    args& moved(const std::string& name, const std::string& hint) {
        moved_.emplace_back(name, hint);
        return *this;
    }

    /// A check that parse runs after reading every option (that -e is not below -b, say); it
    /// throws usage_error.
    args& validate(std::function<void()> check) {
        checks_.push_back(std::move(check));
        return *this;
    }

    /// A paragraph at the end of --help.
    args& note(const std::string& text) {
        notes_.push_back(text);
        return *this;
    }

    /// Sets the declared variables from `argv`. Returns false where -h or --help asked for the
    /// help, which is then all it did. Throws usage_error.
    bool parse(int argc, const char* const* argv) {
        for (int i = 1; i < argc; ++i) {
            std::string a = argv[i];
            if (a == "-h" || a == "--help") return false;
            std::string name = a;
            std::string value;
            bool has_value = false;
            if (a.rfind("--", 0) == 0 && a.find('=') != std::string::npos) {
                name = a.substr(0, a.find('='));
                value = a.substr(a.find('=') + 1);
                has_value = true;
            } else if (a.size() > 2 && a[0] == '-' && a[1] != '-' &&
                       (find(a.substr(0, 2)) || moved_hint(a.substr(0, 2)))) {
                name = a.substr(0, 2);  // -b4, as getopt reads it
                value = a.substr(2);
                has_value = true;
            }
            if (const std::string* hint = moved_hint(name)) throw usage_error(name + ": " + *hint);
            const option* o = find(name);
            if (o == nullptr) {
                throw usage_error(a.empty() || a[0] != '-' ? "unexpected argument '" + a + "'"
                                                           : "unknown option " + name);
            }
            if (!has_value) {
                if (i + 1 >= argc) throw usage_error(name + " needs a value (" + o->metavar + ")");
                value = argv[++i];
            }
            o->set(name, value);
        }
        for (const auto& check : checks_) check();
        return true;
    }

    /// The usage line, the summary, every option with its default, and the notes, wrapped at
    /// 100 columns.
    std::string help() const {
        std::vector<std::pair<std::string, std::string>> rows;
        std::size_t width = 0;
        for (const auto& o : options_) {
            std::string text = o.help;
            if (!o.default_text.empty()) text += " (default " + o.default_text + ")";
            rows.emplace_back("  " + join(o.names, ", ") + " " + o.metavar, text);
        }
        rows.emplace_back("  -h, --help", "this text");
        for (const auto& r : rows) width = std::max(width, r.first.size());
        width = std::min<std::size_t>(width, 30) + 2;
        std::string out =
            "usage: " + program_ + " [options]\n\n" + wrap(summary_, 0) + "\noptions:\n";
        for (const auto& [head, text] : rows) {
            // A head too long for the column has the help on the next line.
            // Appended piece by piece: g++ 12 at -O3 warns falsely (-Wrestrict) about
            // `"literal" + std::string`.
            out += head;
            if (head.size() + 2 > width) {
                out += '\n';
                out.append(width, ' ');
            } else {
                out.append(width - head.size(), ' ');
            }
            out += wrap(text, width).substr(width);
        }
        for (const auto& n : notes_) {
            out += '\n';
            out += wrap(n, 0);
        }
        return out;
    }

private:
    struct option {
        std::vector<std::string> names;
        std::string metavar;
        std::string help;
        std::string default_text;
        std::function<void(const std::string&, const std::string&)> set;
    };

    args& add(const std::string& names, std::string metavar, const std::string& help,
              std::string default_text,
              std::function<void(const std::string&, const std::string&)> set) {
        option o{split(names, ','), std::move(metavar), help, std::move(default_text),
                 std::move(set)};
        options_.push_back(std::move(o));
        return *this;
    }

    // The hint for an option that moved, or nullptr.
    const std::string* moved_hint(const std::string& name) const {
        for (const auto& [old, hint] : moved_) {
            if (name == old) return &hint;
        }
        return nullptr;
    }

    const option* find(const std::string& name) const {
        for (const auto& o : options_) {
            for (const auto& n : o.names) {
                if (n == name) return &o;
            }
        }
        return nullptr;
    }

    static std::vector<std::string> pick(const std::string& flag, const std::string& v,
                                         const std::vector<std::string>& known, bool several) {
        if (several && v == "all") return known;
        std::vector<std::string> got = several ? split(v, ',') : std::vector<std::string>{v};
        for (const auto& g : got) {
            bool ok = false;
            for (const auto& k : known) ok = ok || g == k;
            if (!ok) {
                throw usage_error(flag + " " + v + ": expected " + (several ? "" : "one of ") +
                                  join(known, ", ") +
                                  (several ? ", all, or several with commas" : ""));
            }
        }
        return got;
    }

    // `text` in lines of at most 100 columns, each indented by `indent` spaces (and broken at
    // its own newlines); a word longer than a line stands alone.
    static std::string wrap(const std::string& text, std::size_t indent) {
        std::string out;
        for (const auto& para : split(text, '\n')) {
            std::string line(indent, ' ');
            bool empty = true;
            for (const auto& word : split(para, ' ')) {
                if (word.empty()) continue;
                if (!empty && line.size() + 1 + word.size() > 100) {
                    out += line + "\n";
                    line.assign(indent, ' ');
                    empty = true;
                }
                line += (empty ? "" : " ") + word;
                empty = false;
            }
            out += line + "\n";
        }
        return out;
    }

    static std::vector<std::string> split(const std::string& s, char sep) {
        std::vector<std::string> out;
        std::size_t at = 0;
        for (std::size_t next; (next = s.find(sep, at)) != std::string::npos; at = next + 1) {
            out.push_back(s.substr(at, next - at));
        }
        out.push_back(s.substr(at));
        return out;
    }

    static std::string join(const std::vector<std::string>& v, const char* sep) {
        std::string out;
        for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
        return out;
    }

    std::string program_;
    std::string summary_;
    std::vector<option> options_;
    std::vector<std::pair<std::string, std::string>> moved_;
    std::vector<std::function<void()>> checks_;
    std::vector<std::string> notes_;
};

/// Parses `argv` into `a`'s variables. On -h or --help prints the help to stdout and exits 0;
/// on a usage_error prints "<program>: <message> (see --help)" to stderr and exits 2.
inline void parse_or_exit(args& a, int argc, char** argv) {
    bool run = false;
    try {
        run = a.parse(argc, argv);
    } catch (const usage_error& e) {
        std::fprintf(stderr, "%s: %s (see --help)\n", a.program().c_str(), e.what());
        std::exit(2);
    }
    if (!run) {
        std::fputs(a.help().c_str(), stdout);
        std::exit(0);
    }
}

/// The size sweep and timing every collective benchmark shares, with nccl-tests' letters and
/// long names.
struct sweep {
    std::size_t min_bytes = 32;
    std::size_t max_bytes = std::size_t{32} << 20;
    double factor = 2;
    int iters = 20;
    int warmup = 5;
    bool check = false;

    /// Declares -b -e -f -n -w -c on `a`, and the check that -e is not below -b (a size of 0
    /// is taken as 1).
    void declare(args& a) {
        a.size("-b,--minbytes", min_bytes, "smallest size")
            .size("-e,--maxbytes", max_bytes, "largest size")
            .real_above("-f,--stepfactor", factor, 1, "each size is the last one times this")
            .integer("-n,--iters", iters, 1, 1000000000, "timed iterations per size")
            .integer("-w,--warmup_iters", warmup, 0, 1000000000, "warm-up iterations per size")
            .boolean("-c,--check", check,
                     "1: check every result; #wrong counts the elements that differ");
        a.validate([this] {
            if (min_bytes == 0) min_bytes = 1;
            if (max_bytes < min_bytes) {
                throw usage_error("-e " + format_size(max_bytes) + " is below -b " +
                                  format_size(min_bytes));
            }
        });
    }

    /// The sizes from -b to -e, each the last one times -f (rounded down), as run_compare.py
    /// computes them too.
    std::vector<std::size_t> sizes() const {
        std::vector<std::size_t> out;
        for (std::size_t b = min_bytes; b <= max_bytes;) {
            out.push_back(b);
            auto next = static_cast<std::size_t>(static_cast<double>(b) * factor);
            if (next <= b) break;
            b = next;
        }
        return out;
    }
};

}  // namespace perf
