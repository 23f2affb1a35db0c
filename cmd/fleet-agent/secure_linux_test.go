package main

import (
	"testing"

	"golang.org/x/sys/unix"
)

func TestHideFromSameUser(t *testing.T) {
	if err := hideFromSameUser(); err != nil {
		t.Fatal(err)
	}
	n, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
	if err != nil || n != 0 {
		t.Fatalf("PR_GET_DUMPABLE = %d, %v; want 0", n, err)
	}
}
