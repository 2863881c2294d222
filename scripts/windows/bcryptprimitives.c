/*
 * Test-only stand-in for bcryptprimitives.dll, which Wine 8 lacks and Rust's std imports
 * (ProcessPrng). It forwards to RtlGenRandom (advapi32!SystemFunction036). Real Windows has
 * the genuine DLL: this file is never shipped.
 */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T length)
{
    while (length > 0) {
        ULONG chunk = length > 0x10000000 ? 0x10000000 : (ULONG)length;
        if (!SystemFunction036(data, chunk))
            return FALSE;
        data += chunk;
        length -= chunk;
    }
    return TRUE;
}
