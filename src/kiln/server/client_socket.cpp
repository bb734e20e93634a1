// ClientSocket: finds a connection's descriptor by its addresses and peeks at it to see
// whether the client has closed it (see client_socket.h for why this exists).
#include "kiln/server/client_socket.h"

#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>

namespace kiln::server {

namespace {

// Numeric host and port of a socket address, formatted the way httplib formats them
// (getnameinfo with NI_NUMERICHOST), so the strings compare equal to Request's.
bool host_and_port(const sockaddr_storage& a, socklen_t len, std::string& host, int& port) {
  if (a.ss_family == AF_INET) {
    port = ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
  } else if (a.ss_family == AF_INET6) {
    port = ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
  } else {
    return false;
  }
  char buf[NI_MAXHOST];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, buf, sizeof(buf), nullptr, 0, NI_NUMERICHOST) != 0)
    return false;
  host = buf;
  return true;
}

}  // namespace

ClientSocket ClientSocket::find(const std::string& local_addr, int local_port, const std::string& remote_addr,
                                int remote_port) {
  if (local_port < 0 || remote_port < 0) return ClientSocket(-1);
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return ClientSocket(-1);
  int found = -1;
  std::string host;
  int port = 0;
  // The 4-tuple names one TCP connection; only the handler's own thread closes that descriptor
  // (after the handler returns), so a match here stays the right socket while the handler runs.
  // Descriptors opened or closed by other threads during the scan cannot carry this tuple.
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    int fd = std::atoi(e->d_name);
    sockaddr_storage a{};
    socklen_t len = sizeof(a);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) continue;  // not a socket
    if (!host_and_port(a, len, host, port) || port != local_port || host != local_addr) continue;
    len = sizeof(a);
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) continue;  // a listening socket
    if (!host_and_port(a, len, host, port) || port != remote_port || host != remote_addr) continue;
    found = fd;
    break;
  }
  closedir(dir);
  return ClientSocket(found);
}

bool ClientSocket::peer_closed() const {
  if (fd_ < 0) return false;
  char c;
  ssize_t n = recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return false;                                    // bytes waiting: still there
  if (n == 0) return true;                                    // end of stream: the client closed
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return false;  // nothing yet
  return true;                                                // reset or another error
}

bool ClientSocket::peer_closed_throttled(std::chrono::milliseconds every) {
  if (closed_ || fd_ < 0) return closed_;
  auto now = std::chrono::steady_clock::now();
  if (last_look_ != std::chrono::steady_clock::time_point{} && now - last_look_ < every) return false;
  last_look_ = now;
  closed_ = peer_closed();
  return closed_;
}

}  // namespace kiln::server
