// Socket addresses and interface selection (NCCL_SOCKET_IFNAME / NCCL_SOCKET_FAMILY semantics).
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>

#include "bagua/net/engine.h"

namespace bagua::net {

uint16_t SocketAddress::port() const {
  if (family() == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  }
  if (family() == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  }
  return 0;
}

std::string SocketAddress::toString() const {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (family() == AF_INET) {
    const auto* s4 = reinterpret_cast<const sockaddr_in*>(&storage);
    inet_ntop(AF_INET, &s4->sin_addr, buf, sizeof(buf));
    return strPrintf("%s:%u", buf, port());
  }
  if (family() == AF_INET6) {
    const auto* s6 = reinterpret_cast<const sockaddr_in6*>(&storage);
    inet_ntop(AF_INET6, &s6->sin6_addr, buf, sizeof(buf));
    return strPrintf("[%s]:%u", buf, port());
  }
  return "<no address>";
}

Result<SocketAddress> SocketAddress::parse(std::string_view text) {
  std::string host(text);
  std::string portText;
  if (!host.empty() && host.front() == '[') {
    size_t close = host.find(']');
    if (close == std::string::npos) {
      return BAGUA_ERROR(kInvalidArgument, "address '%s': missing ']'", host.c_str());
    }
    if (close + 1 < host.size()) {
      if (host[close + 1] != ':') {
        return BAGUA_ERROR(kInvalidArgument, "address '%s': expected ':' after ']'", host.c_str());
      }
      portText = host.substr(close + 2);
    }
    host = host.substr(1, close - 1);
  } else if (std::count(host.begin(), host.end(), ':') == 1) {
    size_t colon = host.find(':');
    portText = host.substr(colon + 1);
    host = host.substr(0, colon);
  }
  uint16_t port = 0;
  if (!portText.empty()) {
    Result<int64_t> p = parseInt(portText);
    if (!p.isOk() || *p < 0 || *p > 65535) {
      return BAGUA_ERROR(kInvalidArgument, "address '%.*s': bad port '%s'",
                         static_cast<int>(text.size()), text.data(), portText.c_str());
    }
    port = static_cast<uint16_t>(*p);
  }
  SocketAddress a;
  auto* s4 = reinterpret_cast<sockaddr_in*>(&a.storage);
  auto* s6 = reinterpret_cast<sockaddr_in6*>(&a.storage);
  if (inet_pton(AF_INET, host.c_str(), &s4->sin_addr) == 1) {
    s4->sin_family = AF_INET;
    s4->sin_port = htons(port);
    a.length = sizeof(sockaddr_in);
    return a;
  }
  std::memset(&a.storage, 0, sizeof(a.storage));
  if (inet_pton(AF_INET6, host.c_str(), &s6->sin6_addr) == 1) {
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons(port);
    a.length = sizeof(sockaddr_in6);
    return a;
  }
  return BAGUA_ERROR(kInvalidArgument, "'%.*s' is not a numeric IPv4 or IPv6 address",
                     static_cast<int>(text.size()), text.data());
}

IfnameSpec IfnameSpec::parse(std::string_view text) {
  IfnameSpec s;
  if (!text.empty() && text.front() == '^') {
    s.exclude = true;
    text.remove_prefix(1);
  }
  if (!text.empty() && text.front() == '=') {
    s.exact = true;
    text.remove_prefix(1);
  }
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string_view item =
        text.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos);
    if (!item.empty()) {
      s.names.emplace_back(item);
    }
    if (comma == std::string_view::npos) {
      break;
    }
    pos = comma + 1;
  }
  return s;
}

bool IfnameSpec::matches(std::string_view ifname) const {
  bool listed = false;
  for (const std::string& n : names) {
    if (exact ? ifname == n : ifname.substr(0, n.size()) == n) {
      listed = true;
      break;
    }
  }
  return exclude ? !listed : listed;
}

Result<int> parseAddressFamily(std::string_view text) {
  if (text.empty()) {
    return AF_UNSPEC;
  }
  if (text == "AF_INET") {
    return AF_INET;
  }
  if (text == "AF_INET6") {
    return AF_INET6;
  }
  return BAGUA_ERROR(kInvalidArgument, "address family '%.*s': use AF_INET or AF_INET6",
                     static_cast<int>(text.size()), text.data());
}

namespace {

bool isLinkLocal6(const sockaddr_in6* s6) {
  return IN6_IS_ADDR_LINKLOCAL(&s6->sin6_addr);
}

// Collects up to maxCount interfaces accepted by `accept`, one address each (IPv4 preferred when
// the family is unspecified).
std::vector<NetInterface> collect(ifaddrs* list, int family, size_t maxCount,
                                  const std::function<bool(std::string_view)>& accept) {
  std::vector<NetInterface> out;
  for (int pass = 0; pass < 2; ++pass) {
    int want = family != AF_UNSPEC ? family : (pass == 0 ? AF_INET : AF_INET6);
    if (family != AF_UNSPEC && pass == 1) {
      break;
    }
    for (ifaddrs* ifa = list; ifa != nullptr && out.size() < maxCount; ifa = ifa->ifa_next) {
      if (ifa->ifa_addr == nullptr || ifa->ifa_addr->sa_family != want) {
        continue;
      }
      if ((ifa->ifa_flags & IFF_UP) == 0 || (ifa->ifa_flags & IFF_RUNNING) == 0) {
        continue;
      }
      if (!accept(ifa->ifa_name)) {
        continue;
      }
      if (want == AF_INET6 && isLinkLocal6(reinterpret_cast<sockaddr_in6*>(ifa->ifa_addr))) {
        continue;
      }
      bool seen = false;
      for (const NetInterface& i : out) {
        seen = seen || i.name == ifa->ifa_name;
      }
      if (seen) {
        continue;
      }
      NetInterface ni;
      ni.name = ifa->ifa_name;
      size_t len = want == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
      std::memcpy(&ni.address.storage, ifa->ifa_addr, len);
      ni.address.length = static_cast<socklen_t>(len);
      out.push_back(std::move(ni));
    }
  }
  return out;
}

bool hasPrefix(std::string_view s, std::string_view p) {
  return s.substr(0, p.size()) == p;
}

}  // namespace

Result<std::vector<NetInterface>> findInterfaces(std::string_view ifnameSpec, int family,
                                                 size_t maxCount) {
  if (family != AF_UNSPEC && family != AF_INET && family != AF_INET6) {
    return BAGUA_ERROR(kInvalidArgument, "address family %d is neither AF_INET nor AF_INET6",
                       family);
  }
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    return BAGUA_ERRNO(errno, "getifaddrs");
  }
  std::vector<NetInterface> out;
  if (!ifnameSpec.empty()) {
    IfnameSpec spec = IfnameSpec::parse(ifnameSpec);
    out = collect(list, family, maxCount, [&](std::string_view n) { return spec.matches(n); });
  } else {
    out = collect(list, family, maxCount, [](std::string_view n) {
      return !hasPrefix(n, "docker") && !hasPrefix(n, "lo") && !hasPrefix(n, "virbr");
    });
    if (out.empty()) {
      out = collect(list, family, maxCount,
                    [](std::string_view n) { return hasPrefix(n, "docker"); });
    }
    if (out.empty()) {
      out = collect(list, family, maxCount, [](std::string_view n) { return hasPrefix(n, "lo"); });
    }
  }
  freeifaddrs(list);
  if (out.empty()) {
    return BAGUA_ERROR(kNotFound,
                       "no usable network interface (NCCL_SOCKET_IFNAME='%.*s', family %s): check "
                       "`ip addr`; use NCCL_SOCKET_IFNAME==lo for loopback",
                       static_cast<int>(ifnameSpec.size()), ifnameSpec.data(),
                       family == AF_INET    ? "AF_INET"
                       : family == AF_INET6 ? "AF_INET6"
                                            : "any");
  }
  return out;
}

}  // namespace bagua::net
