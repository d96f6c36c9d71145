#include "store_wire.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace bagua::core::storewire {

Result<Nonce> freshNonce() {
  Nonce n;
  BAGUA_RETURN_IF_ERROR(randomBytes(n.data(), n.size()));
  return n;
}

namespace {

uint32_t getU32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}
void putU32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) {
    p[i] = static_cast<uint8_t>(v >> (8 * i));
  }
}

// The proof one end gives over both nonces: HMAC(Ks, role, sN, cN).
Digest proof(HmacSha256& ks, const char* role, const Nonce& s, const Nonce& c) {
  ks.updateField(role);
  ks.update(s.data(), s.size());
  ks.update(c.data(), c.size());
  return ks.finish();
}

HmacSha256 sessionKey(HmacSha256& ks, const Nonce& s, const Nonce& c) {
  Digest d = proof(ks, "session", s, c);
  return HmacSha256(d.data(), d.size());
}

Digest frameMac(HmacSha256& kc, bool toClient, uint64_t seq, const uint8_t* payload, size_t len) {
  kc.updateField(toClient ? "s2c" : "c2s");
  kc.updateU64(seq);
  kc.update(payload, len);
  return kc.finish();
}

// payload | mac
Bytes sealed(const Bytes& payload, const Digest& mac) {
  Bytes body(payload.size() + mac.size());
  if (!payload.empty()) {
    std::memcpy(body.data(), payload.data(), payload.size());
  }
  std::memcpy(body.data() + payload.size(), mac.data(), mac.size());
  return body;
}

}  // namespace

Bytes i64Bytes(int64_t v) {
  Bytes b(8);
  for (int i = 0; i < 8; ++i) {
    b[i] = static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i));
  }
  return b;
}
int64_t bytesI64(const Bytes& b) {
  uint64_t v = 0;
  for (size_t i = 0; i < 8 && i < b.size(); ++i) {
    v |= static_cast<uint64_t>(b[i]) << (8 * i);
  }
  return static_cast<int64_t>(v);
}

Bytes frame(const Bytes& body) {
  Bytes f(4 + body.size());
  putU32(f.data(), static_cast<uint32_t>(body.size()));
  if (!body.empty()) {
    std::memcpy(f.data() + 4, body.data(), body.size());
  }
  return f;
}

Bytes encodePayload(uint8_t head, const std::vector<Bytes>& args) {
  size_t n = 1 + 4;
  for (const auto& a : args) {
    n += 4 + a.size();
  }
  Bytes out(n);
  uint8_t* p = out.data();
  *p++ = head;
  putU32(p, static_cast<uint32_t>(args.size()));
  p += 4;
  for (const auto& a : args) {
    putU32(p, static_cast<uint32_t>(a.size()));
    p += 4;
    if (!a.empty()) {
      std::memcpy(p, a.data(), a.size());
      p += a.size();
    }
  }
  return out;
}

bool decodePayload(const uint8_t* data, size_t len, uint8_t* head, std::vector<Bytes>* args) {
  if (len < 5) {
    return false;
  }
  *head = data[0];
  const uint32_t n = getU32(data + 1);
  size_t pos = 5;
  args->clear();
  // Every argument takes at least its 4-byte length: a count beyond that is a lie (and must not
  // make us reserve for it).
  if (n > (len - pos) / 4) {
    return false;
  }
  args->reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    if (len - pos < 4) {
      return false;
    }
    const uint32_t alen = getU32(data + pos);
    pos += 4;
    if (alen > len - pos) {
      return false;
    }
    args->emplace_back(data + pos, data + pos + alen);
    pos += alen;
  }
  return pos == len;
}

Result<size_t> FrameReader::feed(const uint8_t* data, size_t len) {
  if (complete_) {
    return size_t{0};
  }
  size_t used = 0;
  if (headerGot_ < 4) {
    const size_t take = std::min(len, 4 - headerGot_);
    std::memcpy(header_ + headerGot_, data, take);
    headerGot_ += take;
    used += take;
    if (headerGot_ < 4) {
      return used;
    }
    expect_ = getU32(header_);
    if (expect_ == 0 || expect_ > max_) {
      return BAGUA_ERROR(kInvalidArgument, "frame length %u outside 1..%u", expect_, max_);
    }
    body_.clear();
  }
  const size_t take = std::min(len - used, static_cast<size_t>(expect_) - body_.size());
  body_.insert(body_.end(), data + used, data + used + take);
  used += take;
  if (body_.size() == expect_) {
    complete_ = true;
  }
  return used;
}

Bytes FrameReader::take() {
  Bytes out = std::move(body_);
  body_ = Bytes();
  headerGot_ = 0;
  expect_ = 0;
  complete_ = false;
  return out;
}

std::variant<Reply, Parked> Data::handle(uint8_t op, const std::vector<Bytes>& args,
                                         bool* changed) {
  *changed = false;
  switch (op) {
  case kSet:
    if (args.size() != 2) {
      break;
    }
    map_[toString(args[0])] = args[1];
    *changed = true;
    return Reply{kOk, {}};
  case kCheck:
    if (args.size() != 1) {
      break;
    }
    return Reply{kOk, {Bytes{static_cast<uint8_t>(map_.count(toString(args[0])) ? 1 : 0)}}};
  case kAdd: {
    if (args.size() != 2) {
      break;
    }
    const std::string key = toString(args[0]);
    int64_t v = 0;
    auto it = map_.find(key);
    if (it != map_.end() && !it->second.empty()) {
      const std::string s = toString(it->second);
      char* end = nullptr;
      errno = 0;
      v = std::strtoll(s.c_str(), &end, 10);
      if (end == s.c_str() || *end != '\0' || errno == ERANGE) {
        return Reply{kBad, {toBytes("key '" + key + "' does not hold an integer counter")}};
      }
    }
    // Wrapping, not undefined behaviour, on overflow.
    v = static_cast<int64_t>(static_cast<uint64_t>(v) + static_cast<uint64_t>(bytesI64(args[1])));
    map_[key] = toBytes(std::to_string(v));
    *changed = true;
    return Reply{kOk, {i64Bytes(v)}};
  }
  case kCas: {
    if (args.size() != 3) {
      break;
    }
    const std::string key = toString(args[0]);
    auto it = map_.find(key);
    Bytes current = it == map_.end() ? Bytes{} : it->second;
    if (current == args[1]) {
      map_[key] = args[2];
      current = args[2];
      *changed = true;
    }
    return Reply{kOk, {current}};
  }
  case kGet:
  case kWait: {
    if (args.size() < 2 || (op == kGet && args.size() != 2)) {
      break;
    }
    Parked p;
    p.op = op;
    p.timeoutMs = std::max<int64_t>(0, bytesI64(args[0]));
    for (size_t i = 1; i < args.size(); ++i) {
      p.keys.push_back(toString(args[i]));
    }
    if (ready(p)) {
      return complete(p);
    }
    return p;
  }
  default:
    break;
  }
  return Reply{kBad, {toBytes(strPrintf("bad request op %u with %zu args", op, args.size()))}};
}

bool Data::ready(const Parked& p) const {
  for (const auto& k : p.keys) {
    if (map_.find(k) == map_.end()) {
      return false;
    }
  }
  return true;
}

Reply Data::complete(const Parked& p) const {
  if (ready(p)) {
    if (p.op == kGet) {
      return Reply{kOk, {map_.at(p.keys[0])}};
    }
    return Reply{kOk, {}};
  }
  Reply r{kDeadline, {}};
  for (const auto& k : p.keys) {
    if (map_.find(k) == map_.end()) {
      r.args.push_back(toBytes(k));
    }
  }
  return r;
}

ServerSession::ServerSession(const Digest& storeKey, const Nonce& serverNonce)
    : store_(storeKey.data(), storeKey.size()), serverNonce_(serverNonce) {}

Bytes ServerSession::challengeFrame() const {
  Bytes body(kChallengeBytes);
  putU32(body.data(), kMagic);
  body[4] = kVersion;
  std::memcpy(body.data() + 5, serverNonce_.data(), serverNonce_.size());
  return frame(body);
}

Digest ServerSession::mac(bool toClient, uint64_t seq, const uint8_t* payload, size_t len) {
  return frameMac(*session_, toClient, seq, payload, len);
}

ServerSession::Action ServerSession::onFrame(const Bytes& body, Data& data, bool* changed) {
  *changed = false;
  Action a;
  if (!authed_) {
    if (body.size() != kHelloBytes || body[0] != kHello) {
      a.reason = strPrintf("a %zu-byte first frame that is not a hello", body.size());
      return a;
    }
    Nonce clientNonce;
    std::memcpy(clientNonce.data(), body.data() + 1, kNonceBytes);
    const Digest want = proof(store_, "client", serverNonce_, clientNonce);
    if (!constantTimeEqual(want.data(), body.data() + 1 + kNonceBytes, kMacBytes)) {
      a.reason = "a hello without the job key's proof (BAGUA_JOB_KEY differs, or a stranger)";
      return a;
    }
    session_.emplace(sessionKey(store_, serverNonce_, clientNonce));
    authed_ = true;
    const Digest mine = proof(store_, "server", serverNonce_, clientNonce);
    Bytes w(kWelcomeBytes);
    w[0] = kOk;
    std::memcpy(w.data() + 1, mine.data(), mine.size());
    a.kind = Action::kSend;
    a.frame = frame(w);
    return a;
  }
  if (body.size() < kMacBytes) {
    a.reason = "a frame shorter than its tag";
    return a;
  }
  const size_t plen = body.size() - kMacBytes;
  const Digest want = mac(false, inSeq_, body.data(), plen);
  if (!constantTimeEqual(want.data(), body.data() + plen, kMacBytes)) {
    a.reason = "a request whose tag does not verify (altered, replayed or out of order)";
    return a;
  }
  ++inSeq_;
  uint8_t op = 0;
  std::vector<Bytes> args;
  if (!decodePayload(body.data(), plen, &op, &args)) {
    a.kind = Action::kSend;
    a.frame = respond(Reply{kBad, {toBytes("malformed request")}});
    return a;
  }
  std::variant<Reply, Parked> r = data.handle(op, args, changed);
  if (auto* p = std::get_if<Parked>(&r)) {
    a.kind = Action::kPark;
    a.parked = std::move(*p);
    return a;
  }
  a.kind = Action::kSend;
  a.frame = respond(std::get<Reply>(r));
  return a;
}

Bytes ServerSession::respond(const Reply& reply) {
  const Bytes payload = encodePayload(reply.code, reply.args);
  const Digest m = mac(true, outSeq_++, payload.data(), payload.size());
  return frame(sealed(payload, m));
}

ClientSession::ClientSession(const Digest& storeKey, const Nonce& clientNonce)
    : store_(storeKey.data(), storeKey.size()), clientNonce_(clientNonce) {}

Digest ClientSession::mac(bool toClient, uint64_t seq, const uint8_t* payload, size_t len) {
  return frameMac(*session_, toClient, seq, payload, len);
}

Result<Bytes> ClientSession::answer(const Bytes& body) {
  if (body.size() != kChallengeBytes || getU32(body.data()) != kMagic) {
    return BAGUA_ERROR(kInvalidArgument,
                       "it did not open with a bagua TCP store challenge (%zu bytes; another "
                       "service on this port, or a bagua of another version?)",
                       body.size());
  }
  if (body[4] != kVersion) {
    return BAGUA_ERROR(kInvalidArgument,
                       "it speaks store protocol version %u, this build %u (every rank must run "
                       "the same bagua)",
                       body[4], kVersion);
  }
  std::memcpy(serverNonce_.data(), body.data() + 5, kNonceBytes);
  const Digest p = proof(store_, "client", serverNonce_, clientNonce_);
  Bytes hello(kHelloBytes);
  hello[0] = kHello;
  std::memcpy(hello.data() + 1, clientNonce_.data(), kNonceBytes);
  std::memcpy(hello.data() + 1 + kNonceBytes, p.data(), p.size());
  return frame(hello);
}

Status ClientSession::welcome(const Bytes& body) {
  const Digest want = proof(store_, "server", serverNonce_, clientNonce_);
  if (body.size() != kWelcomeBytes || body[0] != kOk ||
      !constantTimeEqual(want.data(), body.data() + 1, kMacBytes)) {
    return BAGUA_ERROR(kInvalidArgument,
                       "its answer does not prove this job's key (a store of another job on this "
                       "port, or rank 0 runs with another BAGUA_JOB_KEY)");
  }
  session_.emplace(sessionKey(store_, serverNonce_, clientNonce_));
  return Status::ok();
}

Bytes ClientSession::request(uint8_t op, const std::vector<Bytes>& args) {
  const Bytes payload = encodePayload(op, args);
  const Digest m = mac(false, outSeq_++, payload.data(), payload.size());
  return frame(sealed(payload, m));
}

Result<Reply> ClientSession::response(const Bytes& body) {
  if (body.size() < kMacBytes) {
    return BAGUA_ERROR(kRemoteError, "a response shorter than its tag");
  }
  const size_t plen = body.size() - kMacBytes;
  const Digest want = mac(true, inSeq_, body.data(), plen);
  if (!constantTimeEqual(want.data(), body.data() + plen, kMacBytes)) {
    return BAGUA_ERROR(kRemoteError, "a response whose tag does not verify (altered in transit?)");
  }
  ++inSeq_;
  Reply r;
  if (!decodePayload(body.data(), plen, &r.code, &r.args)) {
    return BAGUA_ERROR(kRemoteError, "a malformed response");
  }
  return r;
}

}  // namespace bagua::core::storewire
