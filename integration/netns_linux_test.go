package integration

// This package's own tests make namespaces by this name.
var newNetNS = NewNetNS

type netNS = NetNS
