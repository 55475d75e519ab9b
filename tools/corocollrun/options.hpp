#pragma once

// corocollrun's command line: torchrun's flags (with '_' or '-' between words), parsed into
// `launch_options`. Kept apart from the launcher so a unit test can drive it.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace corocollrun {

/// A command line that cannot be run; the message names the flag and what is wrong.
struct usage_error : std::invalid_argument {
    using std::invalid_argument::invalid_argument;
};

struct launch_options {
    int nproc_per_node = 1;
    int nnodes = 1;
    int node_rank = 0;
    /// Where the rendezvous store is; node 0 serves it. Empty: 127.0.0.1.
    std::string master_addr;
    /// None: pick a free port (one node only). 0 on node 0: pick one and print it.
    std::optional<std::uint16_t> master_port;
    bool standalone = false;
    int max_restarts = 0;
    /// When a worker fails, the others go on (`--on_failure=continue`): for programs that
    /// survive a rank's death (revoke, then carry on without it). Default: they are stopped.
    bool continue_on_failure = false;
    /// `--on_failure=replace`: the others go on, and the failed worker is started again alone
    /// (up to `max_restarts` times in all), as a process that joins the live group
    /// (COROCOLL_JOIN=1 in its environment; the program calls join_process_group).
    bool replace_on_failure = false;
    /// How often an agent looks at the store for other nodes' failures.
    std::chrono::milliseconds monitor_interval{100};
    /// Between SIGTERM and SIGKILL when workers are stopped.
    std::chrono::milliseconds grace_period{5000};
    /// How long the nodes may take to all join (torchrun's rdzv join_timeout).
    std::chrono::milliseconds join_timeout{std::chrono::seconds(900)};
    /// How long a node whose workers are done waits for the others to end (torchrun's exit
    /// barrier).
    std::chrono::milliseconds exit_barrier_timeout{std::chrono::seconds(300)};
    std::string run_id = "none";
    std::string role = "default";
    /// Prefix every line of worker output with "[rank N] ".
    bool prefix_output = true;
    /// Lines of a failed worker's stderr that the failure report repeats.
    int tail_lines = 10;
    /// The program and its arguments.
    std::vector<std::string> command;

    bool serves_store() const noexcept { return node_rank == 0; }
    std::string store_host() const { return master_addr.empty() ? "127.0.0.1" : master_addr; }
};

inline constexpr const char* usage_text =
    "usage: corocollrun [options] program [args...]\n"
    "\n"
    "Starts nproc_per_node copies of program on this node, each with the environment that\n"
    "torchrun gives its workers (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,\n"
    "MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE=True, ...). Node 0 serves the\n"
    "rendezvous store. Words in flag names may be joined by '_' or '-'; values follow '=' or a\n"
    "space.\n"
    "\n"
    "  --nproc_per_node N|auto  workers on this node (auto: one per CPU core); default 1\n"
    "  --nnodes N               nodes in the job (N or N:N); default 1\n"
    "  --node_rank I            this node's index, 0..nnodes-1; default 0\n"
    "  --master_addr HOST       node 0's address; default 127.0.0.1\n"
    "  --master_port P          node 0's store port; required with --nnodes > 1 (0 on node 0:\n"
    "                           pick a free one and print it); one node: a free port\n"
    "  --rdzv_endpoint HOST:P   the same as --master_addr HOST --master_port P\n"
    "  --rdzv_backend static|c10d, --rdzv_id ID  accepted; the id becomes TORCHELASTIC_RUN_ID\n"
    "  --rdzv_conf join_timeout=S[,exit_barrier_timeout=S]  seconds; defaults 900 and 300\n"
    "  --standalone             one node, store on a free loopback port\n"
    "  --max_restarts N         restart every worker up to N times after a failure; default 0\n"
    "  --on_failure stop|continue|replace  when a worker fails, stop the others (default),\n"
    "                           or let them go on (programs that survive a rank's death;\n"
    "                           the exit status is still a failure's), or let them go on and\n"
    "                           start the failed worker again alone, up to --max_restarts\n"
    "                           times in all, with COROCOLL_JOIN=1 (it joins the others, who\n"
    "                           admit it with grow; exit status 0 if all then succeed)\n"
    "  --monitor_interval S     seconds between looks at other nodes' state; default 0.1\n"
    "  --grace_period S         seconds from SIGTERM to SIGKILL when stopping workers; "
    "default 5\n"
    "  --role NAME              ROLE_NAME for the workers; default 'default'\n"
    "  --no_prefix              pass worker output through without the '[rank N] ' prefix\n"
    "  --tail_lines N           stderr lines of a failed worker to repeat; default 10\n"
    "  --no_python              accepted (corocollrun always starts the program itself)\n"
    "  --tee, --redirects, --log_dir, -t, -r  not supported: worker output always reaches\n"
    "                           corocollrun's stdout and stderr\n"
    "  --version                corocollrun's version (corocoll's)\n"
    "  -h, --help               this text\n";

namespace detail {

// Why --tee, --redirects, --log_dir and their short forms are refused.
inline constexpr const char* no_log_files =
    "is not supported: worker output always reaches corocollrun's stdout and stderr (redirect "
    "those; --no_prefix drops the '[rank N] ' prefix)";

inline int parse_int(std::string_view flag, std::string_view v, int lo, int hi) {
    if (v.empty() || v.size() > 9 ||
        !std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        throw usage_error("--" + std::string(flag) + "=" + std::string(v) +
                          ": expected a whole number");
    }
    int value = std::stoi(std::string(v));
    if (value < lo || value > hi) {
        throw usage_error("--" + std::string(flag) + "=" + std::string(v) + ": must be in [" +
                          std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
    return value;
}

inline std::chrono::milliseconds parse_seconds(std::string_view flag, std::string_view v) {
    std::size_t used = 0;
    double s = -1;
    try {
        s = std::stod(std::string(v), &used);
    } catch (const std::exception&) {
        used = 0;
    }
    if (used != v.size() || v.empty() || !(s >= 0) || s > 1e7) {
        throw usage_error("--" + std::string(flag) + "=" + std::string(v) +
                          ": expected a number of seconds");
    }
    return std::chrono::milliseconds(static_cast<long long>(s * 1000.0 + 0.5));
}

inline std::uint16_t parse_port(std::string_view flag, std::string_view v) {
    return static_cast<std::uint16_t>(parse_int(flag, v, 0, 65535));
}

// "host:port" or "[v6]:port".
inline void parse_endpoint(std::string_view v, launch_options& o) {
    auto colon = v.rfind(':');
    if (colon == std::string_view::npos || colon == 0) {
        throw usage_error("--rdzv_endpoint=" + std::string(v) + ": expected HOST:PORT");
    }
    std::string_view host = v.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
        host = host.substr(1, host.size() - 2);
    }
    o.master_addr = std::string(host);
    o.master_port = parse_port("rdzv_endpoint", v.substr(colon + 1));
}

inline void parse_rdzv_conf(std::string_view v, launch_options& o) {
    while (!v.empty()) {
        auto comma = v.find(',');
        std::string_view item = v.substr(0, comma);
        v = comma == std::string_view::npos ? std::string_view{} : v.substr(comma + 1);
        auto eq = item.find('=');
        std::string_view key = item.substr(0, eq);
        std::string_view value = eq == std::string_view::npos ? "" : item.substr(eq + 1);
        if (key == "join_timeout") {
            o.join_timeout = parse_seconds("rdzv_conf join_timeout", value);
        } else if (key == "exit_barrier_timeout") {
            o.exit_barrier_timeout = parse_seconds("rdzv_conf exit_barrier_timeout", value);
        } else if (key == "timeout" || key == "read_timeout" || key == "last_call_timeout" ||
                   key == "is_host") {
            // torchrun's c10d settings with no counterpart here: harmless to accept.
        } else {
            throw usage_error("--rdzv_conf: unknown setting '" + std::string(key) +
                              "' (known: join_timeout, exit_barrier_timeout)");
        }
    }
}

}  // namespace detail

/// Parses `args` (without the program name). Throws `usage_error`; `--help` yields an empty
/// command and `help = true`, `--version` an empty command and `version = true`.
inline launch_options parse_command_line(const std::vector<std::string>& args, bool* help,
                                         bool* version = nullptr) {
    launch_options o;
    if (help) *help = false;
    if (version) *version = false;
    bool nnodes_given = false;
    bool port_given = false;
    std::size_t i = 0;
    for (; i < args.size(); ++i) {
        std::string_view a = args[i];
        if (a == "--") {
            ++i;
            break;
        }
        if (a == "-h" || a == "--help") {
            if (help) *help = true;
            return o;
        }
        if (a == "--version") {
            if (version) *version = true;
            return o;
        }
        if (a.size() < 2 || a[0] != '-') break;  // the program
        // torchrun's short forms of --tee and --redirects (-t 3, -r 3, -t3).
        if (a.rfind("-t", 0) == 0 || a.rfind("-r", 0) == 0) {
            throw usage_error(std::string(a.substr(0, 2)) + " (torchrun's --" +
                              (a[1] == 't' ? "tee" : "redirects") + ") " + detail::no_log_files);
        }
        if (a.rfind("--", 0) != 0) {
            throw usage_error("unknown option '" + std::string(a) + "' (see --help)");
        }
        std::string name(a.substr(2));
        std::optional<std::string> value;
        if (auto eq = name.find('='); eq != std::string::npos) {
            value = name.substr(eq + 1);
            name.resize(eq);
        }
        std::replace(name.begin(), name.end(), '-', '_');
        auto flag = [&](bool takes_value) {
            if (!takes_value) {
                if (value) throw usage_error("--" + name + " takes no value");
                return std::string();
            }
            if (!value) {
                if (i + 1 >= args.size()) throw usage_error("--" + name + " needs a value");
                value = args[++i];
            }
            return *value;
        };
        if (name == "nproc_per_node") {
            std::string v = flag(true);
            if (v == "auto" || v == "cpu") {
                o.nproc_per_node =
                    static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
            } else if (v == "gpu") {
                throw usage_error(
                    "--nproc_per_node=gpu: corocollrun does not count GPUs; give a "
                    "number");
            } else {
                o.nproc_per_node = detail::parse_int(name, v, 1, 4096);
            }
        } else if (name == "nnodes") {
            std::string v = flag(true);
            auto colon = v.find(':');
            if (colon != std::string::npos) {
                int lo = detail::parse_int(name, std::string_view(v).substr(0, colon), 1, 65536);
                int hi = detail::parse_int(name, std::string_view(v).substr(colon + 1), 1, 65536);
                if (lo != hi) {
                    throw usage_error("--nnodes=" + v +
                                      ": elastic ranges are not supported; give a fixed count");
                }
                o.nnodes = lo;
            } else {
                o.nnodes = detail::parse_int(name, v, 1, 65536);
            }
            nnodes_given = true;
        } else if (name == "node_rank") {
            o.node_rank = detail::parse_int(name, flag(true), 0, 65535);
        } else if (name == "master_addr") {
            o.master_addr = flag(true);
            if (o.master_addr.empty()) throw usage_error("--master_addr is empty");
        } else if (name == "master_port") {
            o.master_port = detail::parse_port(name, flag(true));
            port_given = true;
        } else if (name == "rdzv_endpoint") {
            std::string v = flag(true);
            if (!v.empty()) {
                detail::parse_endpoint(v, o);
                port_given = true;
            }
        } else if (name == "rdzv_backend") {
            std::string v = flag(true);
            if (v != "static" && v != "c10d") {
                throw usage_error("--rdzv_backend=" + v +
                                  ": only static and c10d are known "
                                  "(both use node 0's store)");
            }
        } else if (name == "rdzv_id" || name == "run_id") {
            o.run_id = flag(true);
        } else if (name == "rdzv_conf") {
            detail::parse_rdzv_conf(flag(true), o);
        } else if (name == "standalone") {
            flag(false);
            o.standalone = true;
        } else if (name == "max_restarts") {
            o.max_restarts = detail::parse_int(name, flag(true), 0, 1000000);
        } else if (name == "on_failure") {
            std::string v = flag(true);
            if (v != "stop" && v != "continue" && v != "replace") {
                throw usage_error("--on_failure=" + v + ": expected stop, continue or replace");
            }
            o.continue_on_failure = v != "stop";
            o.replace_on_failure = v == "replace";
        } else if (name == "monitor_interval") {
            o.monitor_interval = detail::parse_seconds(name, flag(true));
            if (o.monitor_interval.count() == 0) o.monitor_interval = std::chrono::milliseconds(1);
        } else if (name == "grace_period") {
            o.grace_period = detail::parse_seconds(name, flag(true));
        } else if (name == "role") {
            o.role = flag(true);
        } else if (name == "no_prefix") {
            flag(false);
            o.prefix_output = false;
        } else if (name == "tail_lines") {
            o.tail_lines = detail::parse_int(name, flag(true), 0, 10000);
        } else if (name == "no_python") {
            flag(false);
        } else if (name == "tee" || name == "redirects" || name == "log_dir") {
            throw usage_error("--" + name + " " + detail::no_log_files);
        } else if (name == "module" || name == "run_path") {
            throw usage_error("--" + name + " is for Python; corocollrun starts a program");
        } else {
            throw usage_error("unknown option '--" + name + "' (see --help)");
        }
    }
    o.command.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
    if (o.command.empty()) throw usage_error("no program to run (see --help)");

    if (o.standalone) {
        if (nnodes_given && o.nnodes != 1) {
            throw usage_error("--standalone runs one node; it cannot go with --nnodes=" +
                              std::to_string(o.nnodes));
        }
        if (port_given || !o.master_addr.empty()) {
            throw usage_error(
                "--standalone picks its own store address; drop --master_addr, "
                "--master_port and --rdzv_endpoint");
        }
    }
    if (o.replace_on_failure && o.max_restarts == 0) {
        throw usage_error(
            "--on_failure=replace needs --max_restarts N: how many workers may be replaced");
    }
    if (o.continue_on_failure && !o.replace_on_failure && o.max_restarts > 0) {
        throw usage_error(
            "--on_failure=continue cannot go with --max_restarts: a restart starts every "
            "worker again, which would end the ones that went on");
    }
    if (o.node_rank >= o.nnodes) {
        throw usage_error("--node_rank=" + std::to_string(o.node_rank) +
                          " must be below --nnodes=" + std::to_string(o.nnodes));
    }
    if (o.nnodes > 1) {
        if (!o.master_port) {
            throw usage_error("--nnodes=" + std::to_string(o.nnodes) +
                              " needs --master_port (the port node 0 serves the store on)");
        }
        if (*o.master_port == 0 && o.node_rank != 0) {
            throw usage_error(
                "--master_port=0 only on node 0 (which then prints the port it "
                "picked); node " +
                std::to_string(o.node_rank) + " must be given that port");
        }
    }
    return o;
}

}  // namespace corocollrun
