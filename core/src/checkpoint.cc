// The checkpoint file (checkpoint.h). Layout, little endian:
//   "BAGUACK1", u32 version (1), u32 section count, then per section (sorted by name):
//   u32 name length, name, u64 payload length, payload, u32 CRC-32 of the payload.
// A tensors payload: u32 count, then per tensor: u32 name length, name, u8 dtype, u64 numel, the
// bytes. An RNG payload: std::mt19937_64's text state (the standard fixes its format).
// A reducer's schedule (DistributedDataParallel::saveSchedule): "BGSC", u32 version (1), i64 step
// counter, u64 length, the algorithm's state bytes.
#include "bagua/core/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>

#include "bagua/core/ddp.h"

namespace bagua::core {

namespace {

constexpr char kMagic[8] = {'B', 'A', 'G', 'U', 'A', 'C', 'K', '1'};
constexpr uint32_t kVersion = 1;

std::array<uint32_t, 256> makeCrcTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) {
      c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    }
    t[i] = c;
  }
  return t;
}

template <typename T>
void put(Bytes& out, T v) {
  // resize + memcpy rather than insert(end, p, p + sizeof(T)): g++ 12 at -O3 (the release
  // buildtype, with werror) reports a false -Warray-bounds on the inlined range insert.
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

void putString(Bytes& out, const std::string& s) {
  put<uint32_t>(out, static_cast<uint32_t>(s.size()));
  out.insert(out.end(), s.begin(), s.end());
}

// Bounds-checked reading of a buffer; every read fails once the buffer is short.
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t len) : p_(data), left_(len) {}
  template <typename T>
  bool get(T* v) {
    if (left_ < sizeof(T)) {
      return false;
    }
    std::memcpy(v, p_, sizeof(T));
    p_ += sizeof(T);
    left_ -= sizeof(T);
    return true;
  }
  bool take(size_t n, const uint8_t** out) {
    if (left_ < n) {
      return false;
    }
    *out = p_;
    p_ += n;
    left_ -= n;
    return true;
  }
  bool getString(std::string* s) {
    uint32_t n = 0;
    const uint8_t* d = nullptr;
    if (!get(&n) || !take(n, &d)) {
      return false;
    }
    s->assign(reinterpret_cast<const char*>(d), n);
    return true;
  }
  size_t left() const { return left_; }

 private:
  const uint8_t* p_;
  size_t left_;
};

Status writeAll(int fd, const uint8_t* data, size_t len, const std::string& path) {
  while (len > 0) {
    ssize_t n = ::write(fd, data, len);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      return BAGUA_ERRNO(errno, "checkpoint: write " + path);
    }
    data += n;
    len -= static_cast<size_t>(n);
  }
  return Status::ok();
}

}  // namespace

uint32_t crc32(const void* data, size_t len, uint32_t crc) {
  static const std::array<uint32_t, 256> table = makeCrcTable();
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < len; ++i) {
    crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  }
  return ~crc;
}

Status CheckpointWriter::addTensors(const std::string& section,
                                    const std::vector<Parameter>& tensors) {
  Bytes out;
  put<uint32_t>(out, static_cast<uint32_t>(tensors.size()));
  for (const Parameter& t : tensors) {
    if (t.device.type != DeviceType::kCpu) {
      return BAGUA_ERROR(kInvalidArgument,
                         "checkpoint section '%s': tensor '%s' is on %s:%d; copy it to host "
                         "memory first",
                         section.c_str(), t.name.c_str(), deviceTypeName(t.device.type),
                         t.device.index);
    }
    if (t.data == nullptr && t.numel > 0) {
      return BAGUA_ERROR(kInvalidArgument, "checkpoint section '%s': tensor '%s' has no data",
                         section.c_str(), t.name.c_str());
    }
    putString(out, t.name);
    put<uint8_t>(out, static_cast<uint8_t>(t.dtype));
    put<uint64_t>(out, t.numel);
    const auto* d = static_cast<const uint8_t*>(t.data);
    out.insert(out.end(), d, d + t.bytes());
  }
  sections_[section] = std::move(out);
  return Status::ok();
}

void CheckpointWriter::addBytes(const std::string& section, Bytes bytes) {
  sections_[section] = std::move(bytes);
}

void CheckpointWriter::addRng(const std::string& section, const std::mt19937_64& rng) {
  std::ostringstream os;
  os << rng;
  sections_[section] = toBytes(os.str());
}

void CheckpointWriter::addInt(const std::string& section, int64_t value) {
  Bytes b;
  put<int64_t>(b, value);
  sections_[section] = std::move(b);
}

Status CheckpointWriter::commit(const std::string& path) const {
  Bytes out(kMagic, kMagic + sizeof(kMagic));
  put<uint32_t>(out, kVersion);
  put<uint32_t>(out, static_cast<uint32_t>(sections_.size()));
  for (const auto& [name, payload] : sections_) {
    putString(out, name);
    put<uint64_t>(out, payload.size());
    out.insert(out.end(), payload.begin(), payload.end());
    put<uint32_t>(out, crc32(payload.data(), payload.size()));
  }
  const std::filesystem::path target(path);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return BAGUA_ERRNO(errno, "checkpoint: create " + tmp);
  }
  Status s = writeAll(fd, out.data(), out.size(), tmp);
  if (s.isOk() && ::fsync(fd) != 0) {
    s = BAGUA_ERRNO(errno, "checkpoint: fsync " + tmp);
  }
  ::close(fd);
  if (s.isOk() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    s = BAGUA_ERRNO(errno, "checkpoint: rename " + tmp + " to " + path);
  }
  if (!s.isOk()) {
    ::unlink(tmp.c_str());
    return s;
  }
  // The rename itself must reach the disk before the caller calls the checkpoint taken.
  const std::string dir =
      target.has_parent_path() ? target.parent_path().string() : std::string(".");
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return Status::ok();
}

Result<CheckpointReader> CheckpointReader::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) {
      return BAGUA_ERROR(kNotFound, "checkpoint %s does not exist", path.c_str());
    }
    return BAGUA_ERRNO(errno, "checkpoint: open " + path);
  }
  Bytes data;
  uint8_t buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return BAGUA_ERRNO(err, "checkpoint: read " + path);
    }
    if (n == 0) {
      break;
    }
    data.insert(data.end(), buf, buf + n);
  }
  ::close(fd);
  auto damaged = [&](const std::string& what) {
    return BAGUA_ERROR(kInvalidArgument, "checkpoint %s is damaged: %s", path.c_str(),
                       what.c_str());
  };
  Cursor c(data.data(), data.size());
  const uint8_t* magic = nullptr;
  if (!c.take(sizeof(kMagic), &magic) || std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) {
    return damaged("not a bagua checkpoint (bad magic)");
  }
  uint32_t version = 0;
  uint32_t count = 0;
  if (!c.get(&version) || version != kVersion) {
    return damaged(strPrintf("version %u, this build reads %u", version, kVersion));
  }
  if (!c.get(&count)) {
    return damaged("truncated header");
  }
  CheckpointReader r;
  r.path_ = path;
  for (uint32_t i = 0; i < count; ++i) {
    std::string name;
    uint64_t len = 0;
    const uint8_t* payload = nullptr;
    uint32_t crc = 0;
    if (!c.getString(&name) || !c.get(&len) || !c.take(len, &payload) || !c.get(&crc)) {
      return damaged(strPrintf("truncated at section %u of %u%s%s", i + 1, count,
                               name.empty() ? "" : " ", name.c_str()));
    }
    if (crc32(payload, len) != crc) {
      return damaged(strPrintf("section '%s' fails its CRC", name.c_str()));
    }
    r.sections_[name] = Bytes(payload, payload + len);
  }
  if (c.left() != 0) {
    return damaged(strPrintf("%zu bytes after the last section", c.left()));
  }
  return r;
}

std::vector<std::string> CheckpointReader::sections() const {
  std::vector<std::string> out;
  for (const auto& kv : sections_) {
    out.push_back(kv.first);
  }
  return out;
}

Result<Bytes> CheckpointReader::bytes(const std::string& section) const {
  auto it = sections_.find(section);
  if (it == sections_.end()) {
    std::string have;
    for (const auto& kv : sections_) {
      have += (have.empty() ? "" : ", ") + kv.first;
    }
    return BAGUA_ERROR(kNotFound, "checkpoint %s has no section '%s' (it has: %s)", path_.c_str(),
                       section.c_str(), have.c_str());
  }
  return it->second;
}

Result<int64_t> CheckpointReader::integer(const std::string& section) const {
  BAGUA_ASSIGN_OR_RETURN(Bytes b, bytes(section));
  int64_t v = 0;
  if (b.size() != sizeof(v)) {
    return BAGUA_ERROR(kInvalidArgument, "checkpoint %s: section '%s' is not an integer",
                       path_.c_str(), section.c_str());
  }
  std::memcpy(&v, b.data(), sizeof(v));
  return v;
}

Status CheckpointReader::restoreRng(const std::string& section, std::mt19937_64* rng) const {
  BAGUA_ASSIGN_OR_RETURN(Bytes b, bytes(section));
  std::istringstream is(toString(b));
  std::mt19937_64 r;
  is >> r;
  if (is.fail()) {
    return BAGUA_ERROR(kInvalidArgument, "checkpoint %s: section '%s' is not an RNG state",
                       path_.c_str(), section.c_str());
  }
  *rng = r;
  return Status::ok();
}

Status CheckpointReader::restoreTensors(const std::string& section,
                                        const std::vector<Parameter>& tensors) const {
  BAGUA_ASSIGN_OR_RETURN(Bytes b, bytes(section));
  struct Saved {
    DataType dtype;
    uint64_t numel;
    const uint8_t* data;
  };
  std::map<std::string, Saved> saved;
  Cursor c(b.data(), b.size());
  uint32_t count = 0;
  if (!c.get(&count)) {
    return BAGUA_ERROR(kInvalidArgument, "checkpoint %s: section '%s' is not a tensor list",
                       path_.c_str(), section.c_str());
  }
  for (uint32_t i = 0; i < count; ++i) {
    std::string name;
    uint8_t dtype = 0;
    uint64_t numel = 0;
    const uint8_t* data = nullptr;
    if (!c.getString(&name) || !c.get(&dtype) || !c.get(&numel) || dtype > 6 ||
        !c.take(numel * dataTypeSize(static_cast<DataType>(dtype)), &data)) {
      return BAGUA_ERROR(kInvalidArgument,
                         "checkpoint %s: section '%s' is damaged at tensor %u of %u", path_.c_str(),
                         section.c_str(), i + 1, count);
    }
    saved[name] = {static_cast<DataType>(dtype), numel, data};
  }
  std::set<std::string> wanted;
  for (const Parameter& t : tensors) {
    wanted.insert(t.name);
    auto it = saved.find(t.name);
    if (it == saved.end()) {
      return BAGUA_ERROR(kNotFound, "checkpoint %s: section '%s' has no tensor '%s'", path_.c_str(),
                         section.c_str(), t.name.c_str());
    }
    if (it->second.dtype != t.dtype || it->second.numel != t.numel) {
      return BAGUA_ERROR(kInvalidArgument,
                         "checkpoint %s: tensor '%s' of section '%s' was saved as %llu x %s but "
                         "the model has %zu x %s",
                         path_.c_str(), t.name.c_str(), section.c_str(),
                         static_cast<unsigned long long>(it->second.numel),
                         dataTypeName(it->second.dtype), t.numel, dataTypeName(t.dtype));
    }
    if (t.device.type != DeviceType::kCpu) {
      return BAGUA_ERROR(kInvalidArgument,
                         "checkpoint %s: tensor '%s' is on %s; restore into host memory",
                         path_.c_str(), t.name.c_str(), deviceTypeName(t.device.type));
    }
  }
  for (const auto& kv : saved) {
    if (wanted.count(kv.first) == 0) {
      return BAGUA_ERROR(kInvalidArgument,
                         "checkpoint %s: section '%s' holds tensor '%s' that the list being "
                         "restored does not have",
                         path_.c_str(), section.c_str(), kv.first.c_str());
    }
  }
  // Everything checked: only now write, so a failed restore leaves the tensors untouched.
  for (const Parameter& t : tensors) {
    const Saved& s = saved.at(t.name);
    if (t.bytes() > 0) {
      std::memcpy(t.data, s.data, t.bytes());
    }
  }
  return Status::ok();
}

// --- the reducer's schedule ---------------------------------------------------------------------

namespace {
constexpr uint32_t kScheduleMagic = 0x43534742;  // "BGSC"
constexpr uint32_t kScheduleVersion = 1;
}  // namespace

Result<Bytes> DistributedDataParallel::saveSchedule() {
  if (inBackward_) {
    return BAGUA_ERROR(kFailedPrecondition,
                       "saveSchedule() during a backward pass: save between steps");
  }
  BAGUA_RETURN_IF_ERROR(drainBuckets());  // the algorithm's state settles with its collectives
  BAGUA_ASSIGN_OR_RETURN(Bytes algo, impl_->saveState(*this));
  Bytes out;
  put<uint32_t>(out, kScheduleMagic);
  put<uint32_t>(out, kScheduleVersion);
  put<int64_t>(out, trainStep_);
  put<uint64_t>(out, algo.size());
  out.insert(out.end(), algo.begin(), algo.end());
  return out;
}

Status DistributedDataParallel::restoreSchedule(std::span<const uint8_t> bytes, bool counterOnly) {
  if (trainStep_ != 0) {
    return BAGUA_ERROR(kFailedPrecondition,
                       "restoreSchedule() after %lld forwards: restore before the first one",
                       static_cast<long long>(trainStep_));
  }
  Cursor c(bytes.data(), bytes.size());
  uint32_t magic = 0;
  uint32_t version = 0;
  int64_t step = 0;
  uint64_t len = 0;
  const uint8_t* algo = nullptr;
  if (!c.get(&magic) || magic != kScheduleMagic || !c.get(&version)) {
    return BAGUA_ERROR(kInvalidArgument, "not a reducer schedule (%zu bytes, bad magic)",
                       bytes.size());
  }
  if (version != kScheduleVersion) {
    return BAGUA_ERROR(kInvalidArgument, "reducer schedule of version %u; this build reads %u",
                       version, kScheduleVersion);
  }
  if (!c.get(&step) || step < 0 || !c.get(&len) || !c.take(len, &algo) || c.left() != 0) {
    return BAGUA_ERROR(kInvalidArgument,
                       "the reducer schedule is damaged (%zu bytes: truncated, a negative step "
                       "or trailing bytes)",
                       bytes.size());
  }
  if (!counterOnly) {
    BAGUA_RETURN_IF_ERROR(impl_->restoreState(*this, std::span<const uint8_t>(algo, len)));
  }
  trainStep_ = step;
  return Status::ok();
}

}  // namespace bagua::core
