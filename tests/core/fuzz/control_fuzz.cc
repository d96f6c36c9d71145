// libFuzzer target for everything the control plane reads from bytes a stranger (or a damaged
// disk or cache) controls: the TCP store's frames and handshake, the store's requests after the
// handshake, the socket mesh's hello and published listener, the heartbeat datagram, the
// checkpoint reader and the cache's typed value codec. One binary, so CI runs one target: the
// first byte picks the decoder, the rest is its input. Each decoder must refuse garbage with a
// Status, never crash or read past its input, never allocate for a length it was only told,
// and whatever it accepts must re-encode to the same bytes or fields.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "backend/host/control_wire.h"
#include "bagua/base/crypto.h"
#include "bagua/core/checkpoint.h"
#include "bagua/dataset_cache/value_codec.h"
#include "store_wire.h"

namespace {

using namespace bagua;        // NOLINT(google-build-using-namespace)
using namespace bagua::core;  // NOLINT(google-build-using-namespace)
namespace sw = bagua::core::storewire;
namespace hw = bagua::core::host::wire;

void check(bool ok) {
  if (!ok) {
    __builtin_trap();
  }
}

// The fixed key and nonces of this harness (the seed corpus is made with them, so that seeds
// get past the tags and reach what lies behind).
Digest fuzzKey() {
  return hmacSha256("bagua control-plane fuzz key", "store");
}
sw::Nonce fuzzNonce(uint8_t fill) {
  sw::Nonce n;
  n.fill(fill);
  return n;
}

// 0: a stranger's byte stream into a fresh server session (frames, the hello).
void storeStranger(const uint8_t* data, size_t size) {
  sw::ServerSession server(fuzzKey(), fuzzNonce(1));
  sw::FrameReader reader(server.maxFrame());
  sw::Data store;
  size_t pos = 0;
  while (pos < size) {
    Result<size_t> used = reader.feed(data + pos, size - pos);
    if (!used.isOk()) {
      return;
    }
    check(*used > 0 && *used <= size - pos);
    check(reader.buffered() <= size_t{4} + server.maxFrame());
    pos += *used;
    if (!reader.hasFrame()) {
      continue;
    }
    bool changed = false;
    sw::ServerSession::Action a = server.onFrame(reader.take(), store, &changed);
    if (a.kind == sw::ServerSession::Action::kClose) {
      return;
    }
    reader.setMaxFrame(server.maxFrame());
  }
}

// 1: requests of an authenticated client: the input is a sequence of (u16 length, payload); the
// harness seals each payload as the client would, so the server decodes and runs it.
void storeRequests(const uint8_t* data, size_t size) {
  sw::ServerSession server(fuzzKey(), fuzzNonce(1));
  sw::ClientSession client(fuzzKey(), fuzzNonce(2));
  sw::Data store;
  bool changed = false;
  const Bytes challenge = server.challengeFrame();
  Result<Bytes> hello = client.answer(Bytes(challenge.begin() + 4, challenge.end()));
  check(hello.isOk());
  sw::ServerSession::Action w =
      server.onFrame(Bytes(hello->begin() + 4, hello->end()), store, &changed);
  check(w.kind == sw::ServerSession::Action::kSend);
  check(client.welcome(Bytes(w.frame.begin() + 4, w.frame.end())).isOk());
  size_t pos = 0;
  while (pos + 2 <= size) {
    const size_t len = std::min<size_t>(data[pos] | (data[pos + 1] << 8), size - pos - 2);
    pos += 2;
    uint8_t op = 0;
    std::vector<Bytes> args;
    const bool wellFormed = sw::decodePayload(data + pos, len, &op, &args);
    if (wellFormed) {
      check(sw::encodePayload(op, args) == Bytes(data + pos, data + pos + len));
    }
    pos += len;
    if (!wellFormed) {
      return;  // a real client cannot send it; the stranger path covers malformed frames
    }
    const Bytes frame = client.request(op, args);
    sw::ServerSession::Action a =
        server.onFrame(Bytes(frame.begin() + 4, frame.end()), store, &changed);
    if (a.kind == sw::ServerSession::Action::kPark) {
      // Answered at its deadline, keys there or not.
      a.frame = server.respond(store.complete(a.parked));
    }
    check(a.kind != sw::ServerSession::Action::kClose);
    Result<sw::Reply> r = client.response(Bytes(a.frame.begin() + 4, a.frame.end()));
    check(r.isOk());
  }
}

// 2: the socket mesh's hello and the published listener text.
void meshHello(const uint8_t* data, size_t size) {
  const Digest k = hmacSha256("bagua control-plane fuzz key", "mesh");
  HmacSha256 key(k.data(), k.size());
  hw::Nonce nonce;
  nonce.fill(3);
  Result<int> from = hw::verifyHello(data, size, key, nonce, 0, 8);
  if (from.isOk()) {
    check(*from > 0 && *from < 8);
    hw::Hello again = hw::encodeHello(key, nonce, static_cast<uint32_t>(*from), 0);
    check(std::memcmp(again.data(), data, again.size()) == 0);
  }
  std::string hostPort;
  hw::Nonce parsed{};
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (hw::parseListener(text, &hostPort, &parsed)) {
    check(hw::publishListener(hostPort, parsed) == text);
  }
}

// 3: the heartbeat datagram.
void heartbeat(const uint8_t* data, size_t size) {
  const Digest k = hmacSha256("bagua control-plane fuzz key", "heartbeat");
  HmacSha256 key(k.data(), k.size());
  hw::Nonce nonce;
  nonce.fill(4);
  Result<hw::Beat> b = hw::parseBeat(data, size);
  if (!b.isOk()) {
    return;
  }
  check(size == hw::kDatagramBytes);
  const bool genuine = hw::verifyBeat(data, key, nonce);
  const hw::Datagram again = hw::encodeBeat(key, nonce, *b);
  check(std::memcmp(again.data(), data, 24) == 0);
  check(genuine == (std::memcmp(again.data(), data, again.size()) == 0));
}

// 4: the checkpoint reader, from a file in memory.
void checkpoint(const uint8_t* data, size_t size) {
  const int fd = ::memfd_create("bagua-fuzz-checkpoint", MFD_CLOEXEC);
  if (fd < 0) {
    return;
  }
  if (size > 0 && ::write(fd, data, size) != static_cast<ssize_t>(size)) {
    ::close(fd);
    return;
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  Result<CheckpointReader> r = CheckpointReader::open(path);
  ::close(fd);
  if (!r.isOk()) {
    return;
  }
  for (const std::string& s : r->sections()) {
    check(r->has(s));
    check(r->bytes(s).isOk());
    (void)r->integer(s);
    std::mt19937_64 rng;
    (void)r->restoreRng(s, &rng);
    (void)r->restoreTensors(s, {});
  }
}

// 5: the cache's typed value codec.
void cacheValue(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  Result<std::vector<cache::codec::Item>> items = cache::codec::decode(bytes);
  if (!items.isOk()) {
    return;
  }
  Result<std::string> again = cache::codec::encode(*items);
  check(again.isOk() && *again == bytes);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) {
    return 0;
  }
  const uint8_t* in = data + 1;
  const size_t n = size - 1;
  switch (data[0] % 6) {
  case 0:
    storeStranger(in, n);
    break;
  case 1:
    storeRequests(in, n);
    break;
  case 2:
    meshHello(in, n);
    break;
  case 3:
    heartbeat(in, n);
    break;
  case 4:
    checkpoint(in, n);
    break;
  default:
    cacheValue(in, n);
    break;
  }
  return 0;
}
