#include "batchtune/distributed/launch.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "batchtune/common/error.h"

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
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    throw Error(fmt::format("{}: '{}' is not ADDR:PORT (e.g. 10.0.0.1:29500)", what, text));
  }
  const std::string port_text = text.substr(colon + 1);
  char* end = nullptr;
  const long port = std::strtol(port_text.c_str(), &end, 10);
  if (port_text.empty() || *end != '\0' || port < 1 || port > 65535) {
    throw Error(fmt::format("{}: '{}' has no TCP port (1-65535) after the colon", what, text));
  }
  return {text.substr(0, colon), static_cast<int>(port)};
}

LaunchResult launch(const LaunchOptions& o, std::ostream& out) {
  if (o.nproc() < 1) throw Error(fmt::format("--nproc: must be at least 1, got {}", o.nproc()));
  if (o.nnodes() < 1) throw Error(fmt::format("--nnodes: must be at least 1, got {}", o.nnodes()));
  if (o.node_rank() < 0 || o.node_rank() >= o.nnodes()) {
    throw Error(fmt::format("--node-rank: must be from 0 to {} (--nnodes - 1), got {}",
                            o.nnodes() - 1, o.node_rank()));
  }
  if (o.nnodes() > 1 && o.master_port() == 0) {
    throw Error("--master: several hosts need ADDR:PORT of node 0, the same on every host");
  }
  if (o.args().empty()) {
    throw Error("launch: nothing to run; give the command after --, e.g. "
                "batchtune launch --nproc 2 -- train --steps 10");
  }
  const int port = o.master_port() > 0 ? o.master_port() : free_tcp_port();
  const int64_t world = o.nproc() * o.nnodes();

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

    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      throw std::runtime_error("launch: pipe: " + std::string(strerror(errno)));
    }
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("launch: fork: " + std::string(strerror(errno)));
    if (pid == 0) {
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
  using Clock = std::chrono::steady_clock;
  Clock::time_point stop_sent{};
  Clock::time_point all_exited{};
  bool killed = false;
  std::vector<char> buffer(1 << 16);
  for (;;) {
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
      if (failed(status) && result.failed_rank < 0) {
        result.failed_rank = r.rank;
        result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
        result.message = fmt::format("rank {} {}; stopping the other ranks", r.rank,
                                     describe_status(status));
        if (o.stop_on_failure()) {
          for (auto& other : ranks) {
            if (other.running) ::kill(other.pid, SIGTERM);
          }
          stop_sent = Clock::now();
        }
      }
    }
    const bool any_running =
        std::any_of(ranks.begin(), ranks.end(), [](const Rank& r) { return r.running; });
    const bool any_open =
        std::any_of(ranks.begin(), ranks.end(), [](const Rank& r) { return r.fd >= 0; });
    if (!any_running && !any_open) break;
    if (!any_running && all_exited == Clock::time_point{}) all_exited = Clock::now();
    if (!any_running &&
        std::chrono::duration<double>(Clock::now() - all_exited).count() > kDrainS) {
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
    if (stop_sent != Clock::time_point{} && !killed &&
        std::chrono::duration<double>(Clock::now() - stop_sent).count() > o.grace_s()) {
      for (auto& r : ranks) {
        if (r.running) ::kill(r.pid, SIGKILL);
      }
      killed = true;
    }
  }
  if (result.failed_rank < 0) result.message = fmt::format("{} rank(s) finished", ranks.size());
  return result;
}

}  // namespace batchtune
