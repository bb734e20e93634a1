// ClientSocket: finds the accepted side of a loopback TCP connection by its 4-tuple (not the
// client's side, not the listener) and tells a live client from one that closed or reset.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "kiln/server/client_socket.h"

using kiln::server::ClientSocket;

namespace {

int port_of(int fd, bool peer) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  int rc = peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len)
                : getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  EXPECT_EQ(rc, 0);
  return ntohs(a.sin_port);
}

// A listener on 127.0.0.1 (any port), a client connected to it and the accepted server side.
struct Loopback {
  int listener = -1, client = -1, accepted = -1;
  int server_port = 0, client_port = 0;
  Loopback() {
    listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    EXPECT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(listen(listener, 4), 0);
    server_port = port_of(listener, false);
    client = socket(AF_INET, SOCK_STREAM, 0);
    a.sin_port = htons(static_cast<uint16_t>(server_port));
    EXPECT_EQ(connect(client, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    accepted = accept(listener, nullptr, nullptr);
    EXPECT_GE(accepted, 0);
    client_port = port_of(client, false);
  }
  ~Loopback() {
    for (int fd : {listener, client, accepted})
      if (fd >= 0) close(fd);
  }
  ClientSocket find() const { return ClientSocket::find("127.0.0.1", server_port, "127.0.0.1", client_port); }
};

// peer_closed() after the FIN or RST has surely arrived (loopback: at once, but allow a moment).
bool closed_soon(const ClientSocket& s) {
  for (int i = 0; i < 100; ++i) {
    if (s.peer_closed()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

}  // namespace

TEST(ClientSocket, FindsTheAcceptedSideByItsAddresses) {
  Loopback l;
  ClientSocket s = l.find();
  ASSERT_TRUE(s.valid());
  EXPECT_EQ(s.fd(), l.accepted);
  // The client's own socket has the tuple the other way round.
  ClientSocket c = ClientSocket::find("127.0.0.1", l.client_port, "127.0.0.1", l.server_port);
  ASSERT_TRUE(c.valid());
  EXPECT_EQ(c.fd(), l.client);
}

TEST(ClientSocket, NoMatchIsInvalidAndNeverClosed) {
  Loopback l;
  EXPECT_FALSE(ClientSocket::find("127.0.0.1", l.server_port, "127.0.0.2", l.client_port).valid());
  EXPECT_FALSE(ClientSocket::find("127.0.0.1", l.server_port, "127.0.0.1", l.client_port + 1).valid());
  ClientSocket none = ClientSocket::find("127.0.0.1", -1, "127.0.0.1", -1);
  EXPECT_FALSE(none.valid());
  EXPECT_FALSE(none.peer_closed());
  EXPECT_FALSE(none.peer_closed_throttled(std::chrono::milliseconds(0)));
}

TEST(ClientSocket, LiveClientIsNotClosedEvenWithBytesPending) {
  Loopback l;
  ClientSocket s = l.find();
  ASSERT_TRUE(s.valid());
  EXPECT_FALSE(s.peer_closed());
  ASSERT_EQ(write(l.client, "GET / HTTP/1.1\r\n", 16), 16);  // a pipelined request, say
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(s.peer_closed());
  char buf[16];
  EXPECT_EQ(recv(l.accepted, buf, sizeof(buf), MSG_DONTWAIT), 16);  // the peek left the bytes there
}

TEST(ClientSocket, ClientCloseIsSeen) {
  Loopback l;
  ClientSocket s = l.find();
  ASSERT_TRUE(s.valid());
  close(l.client);
  l.client = -1;
  EXPECT_TRUE(closed_soon(s));
}

TEST(ClientSocket, ClientResetIsSeen) {
  Loopback l;
  ClientSocket s = l.find();
  ASSERT_TRUE(s.valid());
  linger lg{1, 0};  // close with RST instead of FIN
  ASSERT_EQ(setsockopt(l.client, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
  close(l.client);
  l.client = -1;
  EXPECT_TRUE(closed_soon(s));
}

TEST(ClientSocket, ThrottledLooksAtMostOncePerPeriodAndStaysClosed) {
  Loopback l;
  ClientSocket s = l.find();
  ASSERT_TRUE(s.valid());
  EXPECT_FALSE(s.peer_closed_throttled(std::chrono::milliseconds(0)));
  close(l.client);
  l.client = -1;
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(s.peer_closed());
  // Within the period the last answer (open) stands; after it the close shows, and stays.
  EXPECT_FALSE(s.peer_closed_throttled(std::chrono::hours(1)));
  EXPECT_TRUE(s.peer_closed_throttled(std::chrono::milliseconds(0)));
  EXPECT_TRUE(s.peer_closed_throttled(std::chrono::hours(1)));
}
