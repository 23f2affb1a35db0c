//go:build !linux

package main

import "errors"

func pinElsewhere(int) error { return errors.New("-flooder_cpu needs Linux") }

func pinned(_ int, name string, args ...string) (string, []string) { return name, args }

const canPin = false
