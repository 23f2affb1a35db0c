package policy

// CheckWindowsName refuses a file name (one path component) that Windows
// reads as something other than its text: an alternate data stream
// ("a.txt:s"), a name whose trailing dots or spaces Windows drops, a
// reserved device name (NUL, CON, COM1, ... with any extension), a
// character Windows does not allow in names, or bytes that are not UTF-8.
// The path rules refuse such paths on a Windows host; the agent's file
// layer refuses to open or create such names, so that it never touches a
// file the rules could not judge.
func CheckWindowsName(name string) error { return checkWinName(name) }
