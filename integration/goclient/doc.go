// Package goclient runs the Go client snippet of the top README.md as a
// tested example (Example, in client_example_test.go): an MCP client
// built on the go-sdk calls bash on a host through a real gateway, with
// a real in-process agent behind it. TestREADMESnippet keeps the README's
// snippet and the example the same code. The package holds nothing but
// these tests.
package goclient
