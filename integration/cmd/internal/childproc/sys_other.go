//go:build !linux

package childproc

import "syscall"

// attr: only Linux can tie a child's life to its parent's.
func attr() *syscall.SysProcAttr { return nil }

// CPUSeconds is not measured here.
func (p *Proc) CPUSeconds() float64 { return 0 }
