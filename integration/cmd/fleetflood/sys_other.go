//go:build !linux

package main

import (
	"errors"
	"syscall"
)

func childAttr() *syscall.SysProcAttr { return nil }

func cpuSeconds(int) float64 { return 0 }

func pinElsewhere(int) error { return errors.New("-flooder_cpu needs Linux") }

func pinned(_ int, name string, args ...string) (string, []string) { return name, args }

const canPin = false
