package agent

import (
	"unsafe"

	"golang.org/x/sys/windows"
)

// procGetProcessMemoryInfo is GetProcessMemoryInfo, which kernel32 has
// as K32GetProcessMemoryInfo since Windows 7 (x/sys/windows does not
// wrap it).
var procGetProcessMemoryInfo = kernel32.NewProc("K32GetProcessMemoryInfo")

// processMemoryCounters is PROCESS_MEMORY_COUNTERS (psapi.h).
type processMemoryCounters struct {
	cb                         uint32
	PageFaultCount             uint32
	PeakWorkingSetSize         uintptr
	WorkingSetSize             uintptr
	QuotaPeakPagedPoolUsage    uintptr
	QuotaPagedPoolUsage        uintptr
	QuotaPeakNonPagedPoolUsage uintptr
	QuotaNonPagedPoolUsage     uintptr
	PagefileUsage              uintptr
	PeakPagefileUsage          uintptr
}

// selfRSS returns the process's working set (its resident memory) in
// bytes; 0 when Windows does not say.
func selfRSS() int64 {
	if procGetProcessMemoryInfo.Find() != nil {
		return 0
	}
	c := processMemoryCounters{cb: uint32(unsafe.Sizeof(processMemoryCounters{}))}
	ok, _, _ := procGetProcessMemoryInfo.Call(uintptr(windows.CurrentProcess()), uintptr(unsafe.Pointer(&c)), uintptr(c.cb))
	if ok == 0 {
		return 0
	}
	return int64(c.WorkingSetSize)
}
