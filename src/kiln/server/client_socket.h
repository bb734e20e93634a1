// Seeing from inside a plain (non-streaming) HTTP handler that the client has gone away.
// cpp-httplib 0.11 gives a handler no access to its connection, so ClientSocket finds the socket
// by its TCP 4-tuple (which httplib does put in the Request) and peeks at it, as httplib's own
// is_socket_alive() does for content providers. Linux only (/proc/self/fd); elsewhere find() fails.
#pragma once
#include <chrono>
#include <string>

namespace kiln::server {

class ClientSocket {
 public:
  // The open socket of this process whose local and peer address/port are these (numeric hosts,
  // as httplib writes Request::local_addr / remote_addr). Returns an invalid ClientSocket
  // (valid() false) when none matches. The descriptor is borrowed: it stays open while the
  // handler runs, and is never closed here.
  static ClientSocket find(const std::string& local_addr, int local_port, const std::string& remote_addr,
                           int remote_port);

  bool valid() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  // True when the peer has closed or reset the connection: a peek reads end-of-stream or an
  // error. Pending bytes (a pipelined request) or nothing to read yet mean it is still there.
  // An invalid ClientSocket is never closed.
  bool peer_closed() const;
  // peer_closed(), at most once per `every` (the first call always looks); between looks the
  // last answer is returned. A closed peer stays closed.
  bool peer_closed_throttled(std::chrono::milliseconds every);

 private:
  explicit ClientSocket(int fd) : fd_(fd) {}
  int fd_ = -1;
  bool closed_ = false;
  std::chrono::steady_clock::time_point last_look_{};
};

}  // namespace kiln::server
