#include "textflag.h"

// func cloneExited(flags uintptr) (pid uintptr, errno uintptr)
//
// clone(flags|CLONE_VM|CLONE_VFORK): the child shares this address space
// and this stack, and the calling thread waits until it has exited, which
// it does at once, here, without a call or a return (nothing it does
// touches the stack). Signals must be blocked around it.
TEXT ·cloneExited(SB),NOSPLIT|NOFRAME,$0-24
	MOVQ	flags+0(FP), DI
	ORQ	$0x4100, DI	// CLONE_VM|CLONE_VFORK
	MOVQ	$0, SI		// the same stack
	MOVQ	$0, DX
	MOVQ	$0, R10
	MOVQ	$0, R8
	MOVQ	$56, AX		// SYS_clone
	SYSCALL
	CMPQ	AX, $0
	JNE	parent
	MOVQ	$0, DI
	MOVQ	$231, AX	// SYS_exit_group
	SYSCALL
parent:
	CMPQ	AX, $0xfffffffffffff001
	JLS	ok
	NEGQ	AX
	MOVQ	$0, pid+8(FP)
	MOVQ	AX, errno+16(FP)
	RET
ok:
	MOVQ	AX, pid+8(FP)
	MOVQ	$0, errno+16(FP)
	RET
