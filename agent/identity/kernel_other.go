//go:build !unix

package identity

// kernelRelease returns "": the kernel's release is reported from Unix
// systems only.
func kernelRelease() string { return "" }
