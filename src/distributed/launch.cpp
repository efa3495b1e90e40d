#include "batchtune/distributed/launch.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <optional>

#include "batchtune/common/error.h"
#include "batchtune/common/option.h"
#include "batchtune/distributed/distributed.h"
#include "distributed/wait.h"

extern char** environ;

namespace batchtune {
namespace {

struct Rank {
  int64_t rank = 0;
  pid_t pid = -1;
  int fd = -1;          // read end of its stdout+stderr
  std::string pending;  // a line not finished yet
  bool running = true;
  int status = 0;
};

void forward_lines(Rank& r, const char* data, size_t n, std::ostream& out, bool flush_all) {
  r.pending.append(data, n);
  size_t start = 0;
  for (size_t nl; (nl = r.pending.find('\n', start)) != std::string::npos; start = nl + 1) {
    out << "[rank " << r.rank << "] " << r.pending.substr(start, nl - start + 1);
  }
  r.pending.erase(0, start);
  if (flush_all && !r.pending.empty()) {
    out << "[rank " << r.rank << "] " << r.pending << "\n";
    r.pending.clear();
  }
  out.flush();
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("was killed by signal {}", WTERMSIG(status));
  return "ended";
}

/// After the last rank exited, its output is read for at most this long.
constexpr double kDrainS = 2;

bool failed(int status) { return !WIFEXITED(status) || WEXITSTATUS(status) != 0; }

// The signals a launcher passes on to its ranks: the count received so far,
// and the last one. Lock-free atomics are async-signal-safe.
std::atomic<int> signals_received{0};
std::atomic<int> last_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

void on_launcher_signal(int signal) {
  last_signal = signal;
  signals_received.fetch_add(1);
}

/// While a launch runs, SIGINT, SIGTERM and SIGHUP are counted (not acted on)
/// so that the launch loop forwards each to the ranks and goes on waiting.
class ForwardSignals {
 public:
  ForwardSignals() {
    signals_received = 0;
    last_signal = 0;
    struct sigaction action {};
    action.sa_handler = on_launcher_signal;
    sigemptyset(&action.sa_mask);
    for (size_t i = 0; i < kSignals.size(); ++i) sigaction(kSignals[i], &action, &previous_[i]);
  }
  ~ForwardSignals() {
    for (size_t i = 0; i < kSignals.size(); ++i) sigaction(kSignals[i], &previous_[i], nullptr);
  }
  ForwardSignals(const ForwardSignals&) = delete;
  ForwardSignals& operator=(const ForwardSignals&) = delete;

 private:
  static constexpr std::array<int, 3> kSignals = {SIGINT, SIGTERM, SIGHUP};
  std::array<struct sigaction, 3> previous_{};
};

/// How often a rank being stopped is looked at.
constexpr double kStopPollS = 0.02;

/// Stops ranks already started when the launch cannot go on: SIGTERM, then
/// SIGKILL after `grace_s`, each one reaped.
void stop_ranks(std::vector<Rank>& ranks, double grace_s, Clock& clock) {
  for (auto& r : ranks) {
    if (r.running) ::kill(r.pid, SIGTERM);
  }
  const double deadline_s = clock.now_s() + grace_s;
  for (auto& r : ranks) {
    while (r.running) {
      int status = 0;
      const pid_t done = ::waitpid(r.pid, &status, WNOHANG);
      if (done == r.pid || (done < 0 && errno != EINTR)) {
        r.running = false;
        break;
      }
      if (clock.now_s() > deadline_s) {
        ::kill(r.pid, SIGKILL);
        ::waitpid(r.pid, &status, 0);
        r.running = false;
        break;
      }
      sleep_on(clock, kStopPollS);
    }
    if (r.fd >= 0) ::close(r.fd);
    r.fd = -1;
  }
}

std::string signal_name(int signal) {
  switch (signal) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    default: return fmt::format("signal {}", signal);
  }
}

}  // namespace

int free_tcp_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("free_tcp_port: socket: " + std::string(strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    throw std::runtime_error("free_tcp_port: " + std::string(strerror(errno)));
  }
  const int port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

std::pair<std::string, int> parse_master(const std::string& text, const std::string& what) {
  // An IPv6 address goes in brackets, as in a URL: [::1]:29500.
  size_t colon = text.rfind(':');
  std::string addr = colon == std::string::npos ? text : text.substr(0, colon);
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string::npos || close == 1 || close + 1 >= text.size() ||
        text[close + 1] != ':') {
      throw Error(fmt::format("{}: '{}' is not [IPV6]:PORT (e.g. [::1]:29500)", what, text));
    }
    colon = close + 1;
    addr = text.substr(1, close - 1);
  } else if (colon != std::string::npos && addr.find(':') != std::string::npos) {
    throw Error(fmt::format("{}: '{}': put an IPv6 address in brackets, e.g. [::1]:29500", what,
                            text));
  }
  if (colon == std::string::npos || colon == 0) {
    throw Error(fmt::format("{}: '{}' is not ADDR:PORT (e.g. 10.0.0.1:29500)", what, text));
  }
  const std::string port_text = text.substr(colon + 1);
  char* end = nullptr;
  const long port = std::strtol(port_text.c_str(), &end, 10);
  if (port_text.empty() || *end != '\0' || port < 1 || port > 65535) {
    throw Error(fmt::format("{}: '{}' has no TCP port (1-65535) after the colon", what, text));
  }
  return {addr, static_cast<int>(port)};
}

LaunchResult launch(const LaunchOptions& o, std::ostream& out) {
  if (o.nproc() < 1 || o.nproc() > kMaxLocalRanks) {
    throw OptionError(Option::kNproc,
                      fmt::format("must be from 1 to {}, got {}", kMaxLocalRanks, o.nproc()));
  }
  if (o.nnodes() < 1 || o.nnodes() > kMaxWorldSize / o.nproc()) {
    throw OptionError(Option::kNnodes,
                      fmt::format("must be from 1 to {} (at most {} ranks in all), got {}",
                                  kMaxWorldSize / o.nproc(), kMaxWorldSize, o.nnodes()));
  }
  if (o.node_rank() < 0 || o.node_rank() >= o.nnodes()) {
    throw OptionError(Option::kNodeRank, fmt::format("must be from 0 to {} ({} - 1), got {}",
                                                     o.nnodes() - 1, mention(Option::kNnodes),
                                                     o.node_rank()));
  }
  if (o.nnodes() > 1 && o.master_port() == 0) {
    throw OptionError(Option::kMaster,
                      "several hosts need ADDR:PORT of node 0, the same on every host");
  }
  if (o.args().empty()) {
    throw Error("launch: nothing to run; give the command after --, e.g. "
                "batchtune launch --nproc 2 -- train --steps 10");
  }
  const int port = o.master_port() > 0 ? o.master_port() : free_tcp_port();
  const int64_t world = o.nproc() * o.nnodes();
  Clock& clock = o.clock() != nullptr ? *o.clock() : steady_clock();

  // From here on a signal to the launcher goes to every rank (see below).
  ForwardSignals forward_signals;
  const pid_t launcher = ::getpid();
  std::vector<Rank> ranks;
  for (int64_t local = 0; local < o.nproc(); ++local) {
    Rank r;
    r.rank = o.node_rank() * o.nproc() + local;
    // Everything the child needs is built before fork: after it, only exec.
    std::vector<std::string> env_strings;
    const char* const ours[] = {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=",
                                "GROUP_RANK=", "MASTER_ADDR=", "MASTER_PORT=",
                                "TORCHELASTIC_USE_AGENT_STORE="};
    for (char** e = environ; *e != nullptr; ++e) {
      bool replaced = false;
      for (const char* prefix : ours) replaced |= std::strncmp(*e, prefix, std::strlen(prefix)) == 0;
      if (!replaced) env_strings.emplace_back(*e);
    }
    env_strings.push_back(fmt::format("RANK={}", r.rank));
    env_strings.push_back(fmt::format("WORLD_SIZE={}", world));
    env_strings.push_back(fmt::format("LOCAL_RANK={}", local));
    env_strings.push_back(fmt::format("LOCAL_WORLD_SIZE={}", o.nproc()));
    env_strings.push_back(fmt::format("GROUP_RANK={}", o.node_rank()));
    env_strings.push_back(fmt::format("MASTER_ADDR={}", o.master_addr()));
    env_strings.push_back(fmt::format("MASTER_PORT={}", port));
    if (static_cast<size_t>(local) < o.rank_env().size()) {
      for (const auto& extra : o.rank_env()[static_cast<size_t>(local)]) env_strings.push_back(extra);
    }
    std::vector<char*> envp;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> arg_strings{o.program()};
    arg_strings.insert(arg_strings.end(), o.args().begin(), o.args().end());
    std::vector<char*> argv;
    for (auto& s : arg_strings) argv.push_back(s.data());
    argv.push_back(nullptr);

    // A launch that cannot start every rank stops those it started.
    const auto cannot_start = [&](const char* step) {
      const std::string reason = std::strerror(errno);
      stop_ranks(ranks, o.grace_s(), clock);
      return Error(fmt::format("launch: cannot start rank {} of {} ({}: {}); stopped the {} "
                               "started; use a smaller --nproc or raise the limit (ulimit -n, "
                               "ulimit -u)",
                               r.rank, world, step, reason, ranks.size()));
    };
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw cannot_start("pipe");
    const pid_t pid = ::fork();
    if (pid < 0) {
      ::close(fds[0]);
      ::close(fds[1]);
      throw cannot_start("fork");
    }
    if (pid == 0) {
      // Its own process group: a Ctrl-C at the terminal reaches the launcher
      // alone, which passes it on once. And a rank outlives no launcher, not
      // even one killed with SIGKILL.
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != launcher) ::_exit(143);
      ::signal(SIGINT, SIG_DFL);
      ::signal(SIGTERM, SIG_DFL);
      ::signal(SIGHUP, SIG_DFL);
      ::dup2(fds[1], STDOUT_FILENO);
      ::dup2(fds[1], STDERR_FILENO);
      ::execve(argv[0], argv.data(), envp.data());
      const char msg[] = "launch: exec failed\n";
      (void)!::write(STDERR_FILENO, msg, sizeof(msg) - 1);
      ::_exit(127);
    }
    ::close(fds[1]);
    r.pid = pid;
    r.fd = fds[0];
    ranks.push_back(std::move(r));
  }

  LaunchResult result;
  std::optional<double> stop_sent_s;
  std::optional<double> all_exited_s;
  bool killed = false;
  int forwarded = 0;
  std::vector<char> buffer(1 << 16);
  for (;;) {
    // A signal to the launcher: each rank gets it too and stops as on its
    // own (a checkpoint, a partial summary); a second one ends them at once.
    if (const int received = signals_received.load(); received > forwarded) {
      const int signal = last_signal.load();
      for (auto& r : ranks) {
        if (r.running) ::kill(r.pid, signal);
      }
      if (forwarded == 0) {
        result.signal = signal;
        out << fmt::format("batchtune launch: {}: passed on to the {} rank(s); waiting for them "
                           "to stop (again to end them at once)\n",
                           signal_name(signal), ranks.size());
        out.flush();
      } else if (!stop_sent_s) {
        stop_sent_s = clock.now_s();  // and SIGKILL after the grace period
      }
      forwarded = received;
    }
    std::vector<pollfd> polls;
    std::vector<Rank*> owners;
    for (auto& r : ranks) {
      if (r.fd >= 0) {
        polls.push_back({r.fd, POLLIN, 0});
        owners.push_back(&r);
      }
    }
    if (!polls.empty()) ::poll(polls.data(), polls.size(), 100);
    for (size_t i = 0; i < polls.size(); ++i) {
      if ((polls[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      const ssize_t n = ::read(polls[i].fd, buffer.data(), buffer.size());
      if (n > 0) {
        forward_lines(*owners[i], buffer.data(), static_cast<size_t>(n), out, false);
      } else if (n == 0 || errno != EINTR) {
        forward_lines(*owners[i], "", 0, out, true);
        ::close(owners[i]->fd);
        owners[i]->fd = -1;
      }
    }
    for (auto& r : ranks) {
      if (!r.running) continue;
      int status = 0;
      if (::waitpid(r.pid, &status, WNOHANG) != r.pid) continue;
      r.running = false;
      r.status = status;
      // Ranks stopped by a passed-on signal exit 128+N: not a failure to
      // pass on (another SIGTERM would cut their checkpoint short).
      if (failed(status) && result.failed_rank < 0 && result.signal == 0) {
        result.failed_rank = r.rank;
        result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
        result.message = fmt::format("rank {} {}; stopping the other ranks", r.rank,
                                     describe_status(status));
        if (o.stop_on_failure()) {
          for (auto& other : ranks) {
            if (other.running) ::kill(other.pid, SIGTERM);
          }
          stop_sent_s = clock.now_s();
        }
      }
    }
    const bool any_running =
        std::any_of(ranks.begin(), ranks.end(), [](const Rank& r) { return r.running; });
    const bool any_open =
        std::any_of(ranks.begin(), ranks.end(), [](const Rank& r) { return r.fd >= 0; });
    if (!any_running && !any_open) break;
    if (!any_running && !all_exited_s) all_exited_s = clock.now_s();
    if (!any_running && clock.now_s() - *all_exited_s > kDrainS) {
      // A rank's own children may keep the pipe open; the ranks are done.
      for (auto& r : ranks) {
        if (r.fd >= 0) {
          forward_lines(r, "", 0, out, true);
          ::close(r.fd);
          r.fd = -1;
        }
      }
      break;
    }
    if (stop_sent_s && !killed && clock.now_s() - *stop_sent_s > o.grace_s()) {
      for (auto& r : ranks) {
        if (r.running) ::kill(r.pid, SIGKILL);
      }
      killed = true;
    }
  }
  if (result.signal != 0) {
    result.exit_code = 128 + result.signal;
    result.message = fmt::format("stopped by {}: the {} rank(s) ended", signal_name(result.signal),
                                 ranks.size());
  } else if (result.failed_rank < 0) {
    result.message = fmt::format("{} rank(s) finished", ranks.size());
  }
  return result;
}

}  // namespace batchtune
