package group

// HeartbeatError is heartbeatError, for the test that holds kafka-go's
// reading of heartbeat responses.
var HeartbeatError = heartbeatError

// WaitUntil is waitUntil, for the black-box tests.
var WaitUntil = waitUntil
