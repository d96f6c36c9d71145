// libFuzzer target for everything Bagua-Net parses from untrusted bytes: the 128-byte connection
// handle (it crosses ranks through NCCL's bootstrap), the hello of an accepted socket, control
// records and chunk headers from a peer, and the NCCL_SOCKET_IFNAME / address strings. The
// decoders must reject garbage with a Status, never crash, never read past the input, and
// whatever they accept must re-encode to the same fields.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "bagua/net/engine.h"
#include "wire.h"

namespace {

void check(bool ok) {
  if (!ok) {
    __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace bagua::net;  // NOLINT(google-build-using-namespace)
  // Handle.
  bagua::Result<wire::HandleInfo> h = wire::decodeHandle(data, size);
  if (h.isOk()) {
    Handle again;
    wire::encodeHandle(*h, &again);
    bagua::Result<wire::HandleInfo> h2 = wire::decodeHandle(again.data(), again.size());
    check(h2.isOk() && h2->nonce == h->nonce && h2->address.toString() == h->address.toString());
  }
  // Hello.
  bagua::Result<wire::Hello> hello = wire::decodeHello(data, size);
  if (hello.isOk()) {
    check(hello->nStreams >= 1 && hello->nStreams <= kMaxStreams);
    check(hello->kind == wire::StreamKind::kControl || hello->index < hello->nStreams);
    uint8_t buf[wire::kHelloBytes];
    wire::encodeHello(*hello, buf);
    bagua::Result<wire::Hello> again = wire::decodeHello(buf, sizeof(buf));
    check(again.isOk() && again->connId == hello->connId && again->index == hello->index);
  }
  // Control record.
  bagua::Result<wire::ControlRecord> c = wire::decodeControl(data, size, 64 * 1024);
  if (c.isOk()) {
    check(c->inlineBytes <= 64 * 1024);
    check(c->inlineBytes == 0 || c->inlineBytes == c->size);
  }
  // Chunk header.
  bagua::Result<wire::ChunkHeader> k = wire::decodeChunk(data, size, wire::kMaxChunkWire);
  if (k.isOk()) {
    check(k->length >= 1 && k->length <= wire::kMaxChunkWire);
    check(k->offset + k->length >= k->offset);
  }
  // Strings from the environment.
  std::string_view text(reinterpret_cast<const char*>(data), size);
  IfnameSpec spec = IfnameSpec::parse(text);
  for (const std::string& n : spec.names) {
    check(!n.empty() && n.find(',') == std::string::npos);
  }
  (void)spec.matches("eth0");
  bagua::Result<SocketAddress> a = SocketAddress::parse(text);
  if (a.isOk()) {
    check(a->family() == AF_INET || a->family() == AF_INET6);
  }
  (void)parseAddressFamily(text);
  return 0;
}
