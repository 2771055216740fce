// Package broker is the bus host's broker: the append-only event log with
// its hash chain, the capability vocabulary and grants, the review rules and
// the task.close gate, behind one SQL store with two dialects
// (SQLite for one host, PostgreSQL for several sharing one database), and
// for several hosts each project's placement and its moves (placement.go,
// move.go).
//
// The broker decides who may do what to which task; gitd asks it in-process
// through authz.Authority and bushost through BrokerService. It must never
// take a business, project or task from a grant holder's request (only from
// the grant), never let a reserved event type in through RecordEvent, and
// never check a rule outside the write transaction that appends its event.
package broker
