package localsandbox

// StopLogReader closes the reading end of sb's log pipe, as the end of the process that
// started the sandbox (a manager stopped or restarted) would.
func StopLogReader(sb *Sandbox) { sb.log.stopReading() }
