// CoreDNS with only the plugins the real node's cluster DNS needs (node.sh): names of
// Services and pods from the API server, nothing forwarded to the machine's resolver. The
// upstream main links every plugin (cloud SDKs included); this one builds in about a minute.
package main

import (
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() { coremain.Run() }
